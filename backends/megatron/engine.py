"""The Megatron-core training engine: build, score (log-probs / entropy / values), train.

Algorithm-agnostic: a trainer hands :meth:`MegatronEngine.train_step` a
:class:`~backends.megatron.batch.ResponseBatch` and a ``loss_fn`` that maps the model
outputs of a micro-batch to a scalar or a per-token loss matrix; a matrix is masked with
the batch's ``response_mask`` and divided by the token count of the *whole global
batch* (all micro-batches, all DP ranks), so micro-batching and DP never change the
result (docs/architecture.md §6).

Inputs and outputs are response-aligned ``[B, R]`` (``batch.py``):
``logprobs[:, j] = log p(response token j | everything before it)``, ``entropy[:, j]``
the entropy of that same distribution and ``values[:, j]`` the critic's value of the
state token ``j`` was drawn in; 0 past each row's response. The vocabulary logits are
computed only at the positions that score response tokens (``logit_window.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from backends.device import get_device
from backends.layout import ParamLayout
from backends.megatron import checkpoint
from backends.megatron.batch import GlobalCounts, ResponseBatch
from backends.megatron.builder import build_gpt, initialize_parallel
from backends.megatron.cpu_compat import megatron_compat
from backends.megatron.distributed_optim import DistributedOptimizer
from backends.megatron.families import get_family
from backends.megatron.layouts import canonical_parameters, param_layouts
from backends.megatron.logprobs import vocab_parallel_entropy, vocab_parallel_logprobs
from backends.megatron.optim import (
    OptimSpec,
    clip_gradients,
    lr_factor,
    make_optimizer,
    optimizer_state_tensors,
    reduce_gradients,
)
from backends.megatron.pipeline import MicroBatch, megatron_schedule, run_micro_batches
from backends.megatron.sharding import gather_full_state_dict, load_full_state_dict
from backends.megatron.spec import GPTSpec, ParallelSpec

#: loss_fn(outputs, micro-batch, global counts) -> scalar or per-token loss [b, R];
#: outputs holds logprobs / entropy or values, [b, R] each.
LossFn = Callable[[dict[str, torch.Tensor], ResponseBatch, GlobalCounts], torch.Tensor]


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
    def _outputs(self, output: torch.Tensor, micro: _Scored, with_entropy: bool) -> dict:
        """Per response token, ``[b, R]``, from the last stage's output."""
        if self.value_head:  # output: [b, s, 1], a value at every position (a cheap head)
            per_window = {"values": output.squeeze(-1).float().gather(1, micro.positions)}
        else:  # output: [b, W, v], logits at the window's positions only
            vocab = self.spec.vocab_size
            per_window = {"logprobs": vocab_parallel_logprobs(output, micro.tokens, vocab)}
            if with_entropy:
                per_window["entropy"] = vocab_parallel_entropy(output, vocab)
        return {k: micro.batch.spread(v) for k, v in per_window.items()}

    def _run(
        self, batch: ResponseBatch, micro_batch_size: int | None, head, train: bool
    ) -> list[Any]:
        on_cpu = self.device.torch_device_type == "cpu"
        micro_batches = [
            _Scored.of(micro.to(self.device.device()), self.value_head)
            for micro in batch.split(micro_batch_size)
        ]
        with megatron_compat(self.device):
            if self.parallel.pp > 1 and not on_cpu:
                return megatron_schedule(self.model, micro_batches, head, train)
            return run_micro_batches(self.model, micro_batches, head, self.spec.hidden_size, train)

    @torch.no_grad()
    def forward(
        self,
        batch: ResponseBatch,
        micro_batch_size: int | None = None,
        with_entropy: bool = False,
    ) -> dict[str, torch.Tensor]:
        """Log-probs (and entropy) or values of the response tokens, ``[B, R]`` on every
        rank, computed ``micro_batch_size`` rows at a time (``None``: all at once)."""
        self.model.eval()

        def head(output, micro):
            return None, {
                k: v.detach() for k, v in self._outputs(output, micro, with_entropy).items()
            }

        results = self._run(batch, micro_batch_size, head, train=False)
        return self._share_from_last_stage(results, batch, with_entropy)

    def _share_from_last_stage(self, results, batch: ResponseBatch, with_entropy) -> dict:
        from megatron.core import parallel_state as ps

        keys = (
            ["values"] if self.value_head else ["logprobs"] + (["entropy"] if with_entropy else [])
        )
        out = {}
        for key in keys:
            empty = torch.empty(len(batch), batch.width)  # filled by the broadcast below
            tensor = torch.cat([r[key] for r in results]) if results else empty
            tensor = tensor.to(self.device.device()).float()
            if ps.get_pipeline_model_parallel_world_size() > 1:
                src = ps.get_pipeline_model_parallel_last_rank()
                dist.broadcast(tensor, src=src, group=ps.get_pipeline_model_parallel_group())
            out[key] = tensor.cpu()
        return out

    # ---- training ----------------------------------------------------------------------
    def global_counts(self, batch: ResponseBatch) -> GlobalCounts:
        """Response tokens and rows of this DP rank's ``batch`` summed over all DP ranks
        (collective; one all-reduce for both)."""
        from megatron.core import parallel_state as ps

        counts = torch.stack(
            [batch.response_mask.double().sum(), torch.tensor(len(batch), dtype=torch.double)]
        ).to(self.device.device())
        dist.all_reduce(counts, group=ps.get_data_parallel_group(with_context_parallel=True))
        tokens, sequences = counts.tolist()
        return GlobalCounts(tokens=tokens, sequences=int(sequences))

    def train_step(
        self,
        batch: ResponseBatch,
        loss_fn: LossFn,
        micro_batch_size: int | None = None,
        with_entropy: bool = False,
    ) -> dict[str, float]:
        """One optimizer step over this DP rank's share of the global batch.

        Args:
            batch: this DP rank's share of the global batch.
            loss_fn: ``(outputs, micro_batch, counts) -> [b, R]`` per-token loss (e.g. the
                PPO clip loss), token-meaned here over ``counts.tokens``; or a scalar: the
                micro-batch's share of the global loss, already aggregated and normalised
                with ``counts`` by ``loss_fn``.
            micro_batch_size: rows per forward/backward (``None``: all at once).
            with_entropy: also compute ``outputs["entropy"]`` for ``loss_fn``.

        Returns:
            ``loss`` (global, normalised), ``grad_norm`` (before clipping), ``lr``.
        """
        if self.optimizer is None:
            raise RuntimeError("this engine was built without OptimSpec; it cannot train")
        counts = self.global_counts(batch)
        norm = max(counts.tokens, 1.0)
        self.model.train()
        if self.distributed is not None:
            self.distributed.zero_grad()
        else:
            self.optimizer.zero_grad(set_to_none=True)

        def head(output, micro):
            loss = loss_fn(self._outputs(output, micro, with_entropy), micro.batch, counts)
            if loss.dim() > 0:  # per-token [b, R]: masked and normalised here
                loss = (loss * micro.batch.response_mask).sum() / norm
            return loss, loss.detach()

        losses = self._run(batch, micro_batch_size, head, train=True)
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


@dataclass(frozen=True)
class _Scored(MicroBatch):
    """One micro-batch as the pipeline runs it: the batch and its response window."""

    batch: ResponseBatch
    positions: torch.Tensor  # [b, W] the outputs that score the response tokens
    tokens: torch.Tensor  # [b, W] those tokens

    @classmethod
    def of(cls, batch: ResponseBatch, value_head: bool) -> _Scored:
        positions, tokens = batch.response_window()
        # A critic's value head is one hidden -> 1 product: it runs at every position.
        logit_positions = None if value_head else positions
        return cls(batch.input_ids, logit_positions, batch, positions, tokens)


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
