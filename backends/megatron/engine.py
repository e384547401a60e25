"""The Megatron-core training engine: build, score (log-probs / entropy / values), train.

Algorithm-agnostic: a trainer hands :meth:`MegatronEngine.train_step` a ``loss_fn``
that maps the model outputs of a micro-batch to a per-token loss matrix; the engine
masks it with ``batch["loss_mask"]``, divides by the token count of the *whole global
batch* (all micro-batches, all DP ranks) and accumulates gradients, so micro-batching
and DP never change the result (DESIGN.md §5).

Batches are dicts of ``[b, s]`` tensors: ``input_ids`` (right-padded, starting at
position 0) and ``loss_mask`` (1 where a token's loss counts), plus whatever the loss
function reads. ``logprobs[:, t] = log p(input_ids[:, t] | input_ids[:, :t])`` and
``entropy[:, t]`` is the entropy of that same distribution (the one token ``t`` was
drawn from), both 0 at ``t = 0``; ``values[:, t]`` is the critic's value at position
``t``. With a ``loss_mask`` the vocabulary logits are computed only for each row's
span of masked tokens (``logit_window.py``), and log-probs / entropy outside that span
read 0; without one, at every position.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from backends.device import get_device
from backends.layout import ParamLayout
from backends.megatron import checkpoint
from backends.megatron.builder import build_gpt, initialize_parallel
from backends.megatron.cpu_compat import megatron_compat
from backends.megatron.distributed_optim import DistributedOptimizer
from backends.megatron.families import get_family
from backends.megatron.layouts import canonical_parameters, param_layouts
from backends.megatron.logit_window import logit_positions, place_at_tokens
from backends.megatron.logprobs import vocab_parallel_entropy, vocab_parallel_logprobs
from backends.megatron.optim import (
    OptimSpec,
    clip_gradients,
    lr_factor,
    make_optimizer,
    optimizer_state_tensors,
    reduce_gradients,
)
from backends.megatron.pipeline import (
    LOGIT_POSITIONS,
    LOGIT_VALID,
    megatron_schedule,
    run_micro_batches,
)
from backends.megatron.sharding import gather_full_state_dict, load_full_state_dict
from backends.megatron.spec import GPTSpec, ParallelSpec

Batch = dict[str, torch.Tensor]
#: loss_fn(outputs, batch) -> per-token loss [b, s]; outputs has logprobs / entropy / values.
LossFn = Callable[[dict[str, torch.Tensor], Batch], torch.Tensor]


class MegatronEngine:
    """One rank's share of a Megatron-core GPT (actor, reference or critic).

    Construct it on every rank of a job after ``get_device().init_process_group(...)``;
    all methods are collective over the world unless stated otherwise.

    Args:
        spec: architecture.
        parallel: layout (DP = world / (TP * CP * PP)).
        optim: optimizer settings; ``None`` for a scoring-only role (reference). With
            ``optim.distributed_optimizer`` the parameters live in Megatron DDP's buffers
            and :attr:`optimizer` is Megatron's (see ``distributed_optim.py``).
        value_head: build a critic (values instead of vocabulary logits).
        seed: seed of the initial weights and of Megatron's TP RNG tracker.
    """

    def __init__(
        self,
        spec: GPTSpec,
        parallel: ParallelSpec,
        optim: OptimSpec | None = None,
        value_head: bool = False,
        seed: int = 0,
    ) -> None:
        self.spec, self.parallel, self.optim = spec, parallel, optim
        self.value_head = value_head
        self.device = get_device()
        initialize_parallel(parallel, seed)
        self.model = build_gpt(spec, parallel, value_head=value_head, seed=seed)
        self.optimizer, self.scheduler = None, None
        self.distributed: DistributedOptimizer | None = None
        if optim is not None and optim.distributed_optimizer:
            with megatron_compat(self.device):
                self.distributed = DistributedOptimizer(self.model, optim)
            self.optimizer = self.distributed.optimizer
        elif optim is not None:
            self.optimizer, self.scheduler = make_optimizer(self.model, optim)
        self.step = 0

    # ---- layout ----------------------------------------------------------------------
    def data_parallel_rank(self) -> int:
        """This rank's data-parallel index: ranks with the same index hold the same data."""
        from megatron.core import parallel_state as ps

        return ps.get_data_parallel_rank(with_context_parallel=True)

    def data_parallel_size(self) -> int:
        from megatron.core import parallel_state as ps

        return ps.get_data_parallel_world_size(with_context_parallel=True)

    def is_data_leader(self) -> bool:
        """First TP, PP and CP rank of its data-parallel replica (writes results once)."""
        from megatron.core import parallel_state as ps

        return (
            ps.get_tensor_model_parallel_rank() == 0
            and ps.get_pipeline_model_parallel_rank() == 0
            and ps.get_context_parallel_rank() == 0
        )

    def named_parameters(self) -> dict[str, torch.nn.Parameter]:
        """This rank's parameters under canonical names (what the resharder moves)."""
        return canonical_parameters(self.model)

    # ---- weights ---------------------------------------------------------------------
    def param_layouts(self) -> dict[str, ParamLayout]:
        """Canonical name -> layout of every parameter on this rank (for the resharder)."""
        return param_layouts(self.model)

    def load_hf_state_dict(self, hf: dict[str, torch.Tensor]) -> None:
        """Load full HF tensors (every rank passes the same dict; each keeps its shard)."""
        family = get_family(self.spec.family)
        full = family.hf_to_megatron(hf, self.spec, tp=self.parallel.tp)
        self.load_full_state_dict(full)

    def load_full_state_dict(self, full: dict[str, torch.Tensor]) -> None:
        """Load full canonical Megatron tensors (non-strict for a critic's missing head)."""
        with megatron_compat(self.device):
            load_full_state_dict(self.model, full, strict=not self.value_head)
            if self.distributed is not None:
                self.distributed.reload_model_params()

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every canonical parameter as a full CPU tensor, on every rank."""
        return gather_full_state_dict(self.model)

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The policy as an HF state dict (what generation engines load)."""
        return get_family(self.spec.family).megatron_to_hf(self.full_state_dict(), self.spec)

    # ---- forward passes ----------------------------------------------------------------
    def _outputs(self, output: torch.Tensor, batch: Batch, with_entropy: bool) -> dict:
        """Per-token results ``[b, s]``; token ``t``'s come from the logits at ``t - 1``."""
        if self.value_head:
            return {"values": output.squeeze(-1).float()}  # [b, s]
        ids, vocab = batch["input_ids"], self.spec.vocab_size
        if LOGIT_POSITIONS in batch:  # output: [b, W, v] at the window's positions only
            positions, valid = batch[LOGIT_POSITIONS], batch[LOGIT_VALID]
            targets = ids.gather(1, (positions + 1).clamp(max=ids.shape[1] - 1))
            per_window = {"logprobs": vocab_parallel_logprobs(output, targets, vocab)}
            if with_entropy:
                per_window["entropy"] = vocab_parallel_entropy(output, vocab)
            return {
                k: place_at_tokens(v, positions, valid, ids.shape[1]) for k, v in per_window.items()
            }
        predicting = output[:, :-1]  # [b, s - 1, v]: position t predicts token t + 1
        outputs = {"logprobs": vocab_parallel_logprobs(predicting, ids[:, 1:], vocab)}
        if with_entropy:
            outputs["entropy"] = vocab_parallel_entropy(predicting, vocab)
        return {k: torch.nn.functional.pad(v, (1, 0)) for k, v in outputs.items()}

    def _with_logit_window(self, batch: Batch) -> Batch:
        """``batch`` plus the positions whose logits a loss on ``loss_mask`` reads."""
        if self.value_head or "loss_mask" not in batch:
            return batch
        positions, valid = logit_positions(batch["loss_mask"])
        return {**batch, LOGIT_POSITIONS: positions, LOGIT_VALID: valid}

    def _run(self, micro_batches: list[Batch], head, train: bool) -> list[Any]:
        on_cpu = self.device.torch_device_type == "cpu"
        micro_batches = [
            {k: v.to(self.device.device()) for k, v in self._with_logit_window(b).items()}
            for b in micro_batches
        ]
        with megatron_compat(self.device):
            if self.parallel.pp > 1 and not on_cpu:
                return megatron_schedule(self.model, micro_batches, head, train)
            return run_micro_batches(self.model, micro_batches, head, self.spec.hidden_size, train)

    @torch.no_grad()
    def forward(
        self, micro_batches: list[Batch], with_entropy: bool = False
    ) -> dict[str, torch.Tensor]:
        """Log-probs (and entropy) or values of every micro-batch, ``[B, s]`` on every rank."""
        self.model.eval()

        def head(output, batch):
            return None, {
                k: v.detach() for k, v in self._outputs(output, batch, with_entropy).items()
            }

        results = self._run(micro_batches, head, train=False)
        return self._share_from_last_stage(results, micro_batches, with_entropy)

    def _share_from_last_stage(self, results, micro_batches, with_entropy) -> dict:
        from megatron.core import parallel_state as ps

        keys = (
            ["values"] if self.value_head else ["logprobs"] + (["entropy"] if with_entropy else [])
        )
        shape = (
            sum(b["input_ids"].shape[0] for b in micro_batches),
            micro_batches[0]["input_ids"].shape[1],
        )
        out = {}
        for key in keys:
            tensor = torch.cat([r[key] for r in results]) if results else torch.empty(shape)
            tensor = tensor.to(self.device.device()).float()
            if ps.get_pipeline_model_parallel_world_size() > 1:
                src = ps.get_pipeline_model_parallel_last_rank()
                dist.broadcast(tensor, src=src, group=ps.get_pipeline_model_parallel_group())
            out[key] = tensor.cpu()
        return out

    # ---- training ----------------------------------------------------------------------
    def global_token_count(self, micro_batches: list[Batch]) -> float:
        """Sum of ``loss_mask`` over all micro-batches of all DP ranks (collective)."""
        from megatron.core import parallel_state as ps

        count = sum(b["loss_mask"].double().sum() for b in micro_batches).to(self.device.device())
        dist.all_reduce(count, group=ps.get_data_parallel_group(with_context_parallel=True))
        return float(count)

    def train_step(
        self,
        micro_batches: list[Batch],
        loss_fn: LossFn,
        normalizer: float | None = None,
        with_entropy: bool = False,
    ) -> dict[str, float]:
        """One optimizer step over this DP rank's micro-batches.

        Args:
            micro_batches: this DP rank's share of the global batch.
            loss_fn: ``(outputs, batch) -> [b, s]`` per-token loss (e.g. the PPO clip loss),
                or a scalar: the micro-batch's share of the global loss, already
                aggregated and normalised by the caller (then ``normalizer`` is unused).
            normalizer: divide the masked loss sum by this; ``None``: the global token count
                (token-mean). Pass the global sequence count for seq-mean aggregations.
            with_entropy: also compute ``outputs["entropy"]`` for ``loss_fn``.

        Returns:
            ``loss`` (global, normalised), ``grad_norm`` (before clipping), ``lr``.
        """
        if self.optimizer is None:
            raise RuntimeError("this engine was built without OptimSpec; it cannot train")
        norm = normalizer if normalizer is not None else self.global_token_count(micro_batches)
        norm = max(norm, 1.0)
        self.model.train()
        if self.distributed is not None:
            self.distributed.zero_grad()
        else:
            self.optimizer.zero_grad(set_to_none=True)

        def head(output, batch):
            loss = loss_fn(self._outputs(output, batch, with_entropy), batch)
            if loss.dim() > 0:  # per-token [b, s]: masked and normalised here
                loss = (loss * batch["loss_mask"]).sum() / norm
            return loss, loss.detach()

        losses = self._run(micro_batches, head, train=True)
        grad_norm, lr = self._optimizer_step()
        self.step += 1
        return {"loss": self._global_loss(losses), "grad_norm": grad_norm, "lr": lr}

    def _optimizer_step(self) -> tuple[float, float]:
        """Reduce, clip and apply the grads; the grad norm before clipping and the lr."""
        if self.distributed is not None:
            lr = self.optim.lr * lr_factor(self.step, self.optim)
            with megatron_compat(self.device):
                return self.distributed.step(lr), lr
        with megatron_compat(self.device):
            reduce_gradients(self.model)
            grad_norm = clip_gradients(self.model, self.optim.clip_grad)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        return grad_norm, lr

    def release_gradients(self) -> None:
        """Drop the gradients of the last step (they are dead once the optimizer stepped);
        the next backward makes new ones. Frees a model's worth of memory for generation."""
        if self.distributed is not None:
            self.distributed.release_gradients()
        elif self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)

    def optimizer_state_tensors(self) -> list[torch.Tensor]:
        """Every optimizer state tensor of this rank (what allgather-swap parks on the host).

        AdamW: its moments and steps. Distributed optimizer: this DP rank's moments, steps
        and fp32 main weights (for fp32 models those are views of the weights themselves).
        """
        if self.distributed is not None:
            return self.distributed.state_tensors()
        return optimizer_state_tensors(self.optimizer) if self.optimizer is not None else []

    def _global_loss(self, losses: list[torch.Tensor]) -> float:
        from megatron.core import parallel_state as ps

        total = sum(losses, torch.zeros(())).to(self.device.device()).double()
        if ps.get_tensor_model_parallel_rank() != 0:
            total.zero_()  # every TP rank holds the same loss
        dist.all_reduce(total)
        return float(total)

    # ---- checkpoints -------------------------------------------------------------------
    def save_checkpoint(
        self, root: str | Path, data_position: Any = None, keep: int | None = None
    ) -> Path:
        """Write model, optimizer, RNG and ``data_position`` atomically under ``root``
        (keeping the newest ``keep`` checkpoints when given)."""
        return checkpoint.save(root, self.step, self._state(), data_position, keep)

    def load_checkpoint(self, root: str | Path) -> Any:
        """Resume from ``root``'s latest checkpoint; returns the saved ``data_position``."""
        state, data_position = checkpoint.load_latest(root)
        self.model.load_state_dict(state["model"])
        if self.optimizer is not None:
            _check_optimizer_kind(state["optimizer"], self.distributed is not None, root)
        if self.distributed is not None:
            with megatron_compat(self.device):
                self.distributed.load_state_dict(state["optimizer"])  # collective over DP
        elif self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            _own_optimizer_storage(self.optimizer)
        checkpoint.restore_rng(state["rng"])
        self.step = state["step"]
        return data_position

    def _optimizer_state(self) -> Any:
        if self.distributed is not None:
            with megatron_compat(self.device):
                return self.distributed.state_dict()  # collective over DP
        return self.optimizer.state_dict() if self.optimizer else None

    def _state(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self._optimizer_state(),
            "scheduler": self.scheduler.state_dict() if self.scheduler else None,
            "rng": checkpoint.capture_rng(),
            "step": self.step,
        }


def _check_optimizer_kind(optimizer_state: Any, distributed: bool, root: str | Path) -> None:
    """Refuse a checkpoint written by the other optimizer (their states do not convert)."""
    saved = isinstance(optimizer_state, dict) and "param_state" in optimizer_state
    if saved != distributed:
        raise ValueError(
            f"the checkpoint under {root} was written with distributed_optimizer="
            f"{str(saved).lower()} but this run has {str(distributed).lower()}; resume with "
            "the same optim.distributed_optimizer setting"
        )


def _own_optimizer_storage(optimizer: torch.optim.Optimizer) -> None:
    """Give every optimizer state tensor its own resizable storage.

    Tensors deserialised by ``torch.load`` can sit on storages that refuse
    ``resize_``, and allgather-swap frees device memory exactly that way.
    """
    for state in optimizer.state.values():
        for key, value in state.items():
            if torch.is_tensor(value):
                state[key] = value.clone()
