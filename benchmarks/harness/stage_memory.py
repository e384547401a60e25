"""One actor rank's stages on the CPU, measured as a device would hold them.

A real :class:`~mindrl.workers.roles.ModelWorker` (its Megatron engine, resharder and
generation engine, built by ``build_engines`` as ``setup`` builds them) runs its own
``generate`` and ``update`` methods inside :class:`~benchmarks.harness.live_bytes.LiveBytes`,
for a few iterations; each stage call is one window, and the rollout stage is split at
its four steps (reshard, load, generate, swap-in) so the planner's terms can be compared
one by one. Only this rank's stages are measured: the other roles live in other workers.

What differs from a worker in a Ray run, and why the figures still hold:

* the dock is :class:`InMemoryDock`, a dictionary in this process (the real one is Ray
  actors); a payload ``put`` into it is host memory, as it is in a run, and what
  ``fetch`` returns counts as device memory, standing for the copies the engine makes of
  it on an accelerator;
* the pinned buffers allocated by ``Device.pinned_empty`` (allgather-swap's host copy of
  the training state) and the generation engine's weights while it sleeps are host
  memory on an accelerator, so they are not counted (on the CPU both stay in the same
  RAM: ``sleep(level=1)`` has nowhere to move weights to);
* every response runs to ``rollout.max_response_length`` (no stop token) and every prompt
  is ``rollout.max_prompt_length`` tokens: the worst case, which is what a planner sizes
  a device for;
* the optimizer follows the accelerators' default of torch's multi-tensor (foreach)
  AdamW, whose step holds one temporary the size of the moments (on a CPU torch picks
  the per-tensor loop, whose temporaries are one parameter at a time);
* ``torch.nn.functional.rms_norm`` (Megatron's norm without TransformerEngine) keeps
  what CUDA's fused kernel (``aten::_fused_rms_norm``) keeps for backward, its input and
  the inverse RMS (:class:`FusedRMSNorm`); a CPU build decomposes it into element-wise
  ops, which keep the normalised input and, for 16-bit inputs, float32 copies as well.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from backends.device import get_device
from backends.generation import SamplingParams
from benchmarks.harness.live_bytes import LiveBytes
from mindrl.config import MindRLConfig, load_config
from mindrl.config.specs import engine_specs
from mindrl.dock.schema import RL_FIELDS
from mindrl.run_plan import build_run_plan
from mindrl.workers.context import model_context
from mindrl.workers.roles import ModelWorker
from trainers.registry import get_algorithm

#: The rollout stage's steps, each its own window (``rollout:<step>``).
ROLLOUT_STEPS = ("reshard", "load", "generate", "swap_in")


class InMemoryDock:
    """The transfer dock's ``put`` / ``fetch`` in one process (see the module docstring).

    A stand-in, not the dock: samples by index, fields stored as put, padded with the
    schema's pad value on the way out with ``<field>_lengths`` beside each variable field.
    """

    def __init__(self, live: LiveBytes) -> None:
        self.live = live
        self.samples: dict[int, dict[str, torch.Tensor]] = {}

    def put(self, indexes: Any, data: dict, version: int | None = None) -> None:
        with self.live.host_allocations():  # the dock's copy lives in host memory
            for row, index in enumerate(np.asarray(indexes).tolist()):
                sample = self.samples.setdefault(int(index), {})
                for name, values in data.items():
                    sample[name] = torch.as_tensor(values[row]).clone()

    def fetch(self, indexes: Any, fields: list[str]) -> dict[str, torch.Tensor]:
        rows = [self.samples[int(i)] for i in np.asarray(indexes).tolist()]
        out = {}
        for name in fields:
            values = [row[name] for row in rows]
            if RL_FIELDS[name].variable:
                lengths = torch.tensor([len(v) for v in values], dtype=torch.int64)
                width = int(lengths.max()) if len(values) else 0
                padded = torch.full(
                    (len(values), width), RL_FIELDS[name].pad, dtype=values[0].dtype
                )
                for r, v in enumerate(values):
                    padded[r, : len(v)] = v
                out[name], out[f"{name}_lengths"] = padded, lengths
            else:
                out[name] = torch.stack(values)
        return out

    def take_seconds(self) -> float:
        return 0.0


def measure_actor_stages(
    rank: int,
    world: int,
    config_path: str | None,
    overrides: list[str],
    trainer: str,
    iterations: int = 2,
) -> dict:
    """Run ``iterations`` of this actor rank's rollout and update stages (``run_ranks``
    spawns the ``world`` ranks); every window's peak and end bytes, and the CPU ledger's
    bytes beside the tracker's count of the same tensors at every window's end."""
    algorithm = get_algorithm(trainer)
    config = load_config(config_path, overrides, algorithm)
    plan = build_run_plan(algorithm, config)
    device = get_device()
    windows, ledger = [], []
    with LiveBytes() as live, device_kernels():
        _pinned_is_host(device, live)
        specs = engine_specs(config.actor, plan.layout.training["actor"], 2 * iterations)
        context = model_context(plan, "actor", config, algorithm, specs)
        worker = ModelWorker(rank, world, context, device.name)
        worker.dock = InMemoryDock(live)
        worker.build_engines()
        _sleep_is_host(worker.rollout.generator, live)
        _windows_per_rollout_step(worker.rollout, live)
        _foreach_optimizer(worker.engine.optimizer)
        _window_before_optimizer_step(worker.engine, live)
        live.window("setup")
        extra = list(context.response_fields("update"))
        _put_prompts(worker.dock, config)
        generated, trained = (
            _generation_share(config, rank, world),
            _update_share(config, rank, world),
        )
        for iteration in range(iterations):
            worker.generate(generated, _sampling(config, iteration))
            live.window("rollout")
            _put_update_fields(worker.dock, config, trained, extra, seed=iteration)
            worker.update(trained, "update", _minibatches(config), plan.options)
            live.window("update")
            ledger.append(_ledger_check(device, live))
        windows = [dataclasses.asdict(w) for w in live.windows]
    return {"rank": rank, "windows": windows, "ledger": ledger}


def stage_peaks(windows: list[dict], skip_iterations: int = 1) -> dict[str, int]:
    """The largest peak of every window name and of every stage (``rollout``: the largest
    of its steps' windows and its own, as one stage call on a device sees them) after the
    first ``skip_iterations`` iterations: the first allocates the optimizer state and
    the swap buffers lazily."""
    seen: dict[str, int] = {}
    iteration = -1
    for window in windows:
        if window["name"] == "rollout:reshard":
            iteration += 1
        if iteration < skip_iterations or window["name"] == "setup":
            continue
        for name in {window["name"], window["name"].split(":")[0]}:
            seen[name] = max(seen.get(name, 0), window["peak"])
    return seen


# ---- device semantics on the CPU ------------------------------------------------------
class FusedRMSNorm(torch.autograd.Function):
    """``rms_norm`` keeping for backward what CUDA's fused kernel keeps: the input, the
    weight and the per-row inverse RMS (float32). Same output and gradients as torch's
    (float32 inside, the input's dtype out); backward computes them in closed form."""

    @staticmethod
    def forward(ctx, x, shape, weight, eps):
        dims = tuple(range(-len(shape), 0))
        eps = eps if eps is not None else torch.finfo(x.dtype).eps
        rstd = torch.rsqrt(x.float().pow(2).mean(dims, keepdim=True) + eps)
        normed = x.float() * rstd
        out = (normed * weight if weight is not None else normed).to(x.dtype)
        ctx.save_for_backward(x, weight, rstd)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        width = x.shape[-1]  # one normalised dimension: what Megatron's norms use
        rows_x, rows_g = x.reshape(-1, width), grad.reshape(-1, width)
        rows_rstd = rstd.reshape(-1, 1)
        gx = torch.empty_like(rows_x)
        gw = torch.zeros(width, dtype=torch.float32) if weight is not None else None
        # A few rows at a time, as the kernel works in registers: the float32 temporaries
        # stay small instead of several copies of the input.
        for start in range(0, rows_x.shape[0], _ROWS_PER_CHUNK):
            part = slice(start, start + _ROWS_PER_CHUNK)
            normed = rows_x[part].float() * rows_rstd[part]
            g = rows_g[part].float()
            if gw is not None:
                gw += (g * normed).sum(0)
                g = g * weight.float()
            dot = (g * normed).mean(-1, keepdim=True)
            gx[part] = ((g - normed * dot) * rows_rstd[part]).to(x.dtype)
        gw = gw.to(weight.dtype) if gw is not None and weight.requires_grad else None
        return gx.reshape(x.shape), None, gw, None


#: Rows of the norm's backward computed at once (:class:`FusedRMSNorm`).
_ROWS_PER_CHUNK = 64


@contextlib.contextmanager
def device_kernels() -> Iterator[None]:
    """While active, ``rms_norm`` keeps for backward what the accelerator kernel keeps."""
    functional = torch.nn.functional
    original = functional.rms_norm

    def rms_norm(x, normalized_shape, weight=None, eps=None):
        return FusedRMSNorm.apply(x, tuple(normalized_shape), weight, eps)

    functional.rms_norm = rms_norm
    try:
        yield
    finally:
        functional.rms_norm = original


def _pinned_is_host(device, live: LiveBytes) -> None:
    pinned_empty = device.pinned_empty

    def host_pinned(*args, **kwargs):
        with live.host_allocations():
            return pinned_empty(*args, **kwargs)

    device.pinned_empty = host_pinned


def _sleep_is_host(engine, live: LiveBytes) -> None:
    """An engine's level-1 sleep moves its weights to the host on an accelerator."""
    sleep, wake_up = engine.sleep, engine.wake_up

    def weights():
        return [*engine.model.parameters(), *engine.model.buffers()]

    def host_sleep(level: int = 1) -> None:
        sleep(level)
        if level == 1:
            live.host(weights())

    def device_wake_up() -> None:
        wake_up()
        live.host(weights(), on_host=False)

    engine.sleep, engine.wake_up = host_sleep, device_wake_up


def _windows_per_rollout_step(rollout, live: LiveBytes) -> None:
    """Close a window after each step: the resharder's gather and swap-out, the engine's
    wake-up and load (the rest of ``refresh_weights``), generation, the swap-in."""
    owners = (rollout.resharder, rollout, rollout, rollout)
    methods = ("reshard", "refresh_weights", "generate", "restore_training_state")
    for step, owner, method in zip(ROLLOUT_STEPS, owners, methods, strict=True):
        original = getattr(owner, method)

        def closing(*args, _original=original, _name=f"rollout:{step}", **kwargs):
            result = _original(*args, **kwargs)
            live.window(_name)
            return result

        setattr(owner, method, closing)


def _window_before_optimizer_step(engine, live: LiveBytes) -> None:
    """Split the update at each optimizer step: ``update:micro_batches`` (forward and
    backward of every micro-batch, activations and logits), then the step's own peak."""
    step = engine._optimizer_step

    def windowed():
        live.window("update:micro_batches")
        result = step()
        live.window("update:optimizer_step")
        return result

    engine._optimizer_step = windowed


def _foreach_optimizer(optimizer) -> None:
    """torch AdamW as an accelerator runs it: multi-tensor (CPU default: per tensor)."""
    if isinstance(optimizer, torch.optim.Optimizer):
        for group in optimizer.param_groups:
            group["foreach"] = True


def _ledger_check(device, live: LiveBytes) -> dict[str, int] | None:
    """The CPU ledger's bytes now and the tracker's count of the same tensors."""
    ledger = getattr(device, "ledger", None)
    if ledger is None:
        return None
    tensors = ledger.live_tensors()
    return {"ledger": ledger.allocated(), "tracker": live.bytes_of(tensors)}


# ---- the samples ------------------------------------------------------------------------
def _put_prompts(dock: InMemoryDock, config: MindRLConfig) -> None:
    """G prompts x N samples, every prompt at the longest length, the N samples of a
    prompt sharing it (GRPO's groups)."""
    g, n = config.data.global_batch_size, config.data.n_samples_per_prompt
    generator = torch.Generator().manual_seed(1234)
    prompts = torch.randint(
        1, config.model.vocab_size, (g, config.rollout.max_prompt_length), generator=generator
    )
    dock.put(np.arange(g * n), {"prompt_ids": [prompts[i // n] for i in range(g * n)]})


def _generation_share(config: MindRLConfig, rank: int, world: int) -> np.ndarray:
    """The samples this rank generates: its generation-DP share, whole groups."""
    g, n = config.data.global_batch_size, config.data.n_samples_per_prompt
    groups = np.array_split(np.arange(g * n).reshape(g, n), world // config.rollout.tp)
    return groups[rank // config.rollout.tp].reshape(-1)


def _update_share(config: MindRLConfig, rank: int, world: int) -> np.ndarray:
    """The samples this rank trains on: its data-parallel share."""
    g, n = config.data.global_batch_size, config.data.n_samples_per_prompt
    parallel = config.actor.parallel
    dp = world // (parallel.tp * parallel.cp * parallel.pp)
    dp_rank = rank // (parallel.tp * parallel.cp * parallel.pp) % dp
    return np.array_split(np.arange(g * n), dp)[dp_rank]


def _sampling(config: MindRLConfig, iteration: int) -> SamplingParams:
    rollout = config.rollout
    return SamplingParams(
        temperature=rollout.temperature or 1.0,
        top_p=rollout.top_p,
        top_k=max(rollout.top_k, 0),
        max_tokens=rollout.max_response_length,
        stop_token_ids=(),  # every response to the cap: the worst case
        seed=iteration,
    )


def _put_update_fields(
    dock: InMemoryDock, config: MindRLConfig, indexes: np.ndarray, fields: list[str], seed: int
) -> None:
    """Full-length responses and every field the update reads, for ``indexes``."""
    r = config.rollout.max_response_length
    generator = torch.Generator().manual_seed(seed)
    data = {
        "response_ids": [
            torch.randint(1, config.model.vocab_size, (r,), generator=generator) for _ in indexes
        ],
        **{name: [-torch.rand(r, generator=generator) for _ in indexes] for name in fields},
    }
    dock.put(indexes, data)


def _minibatches(config: MindRLConfig) -> int:
    """Optimizer steps per iteration, as the driver counts them."""
    g = config.data.global_batch_size
    return max(-(-g // (config.actor.mini_batch_size or g)), 1)
