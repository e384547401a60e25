"""LoRA adapters on Megatron's column- and row-parallel linears, sharded with them over TP.

Megatron-Bridge has LoRA, but it imports TransformerEngine unconditionally, which the CPU
(and any device without TE) cannot import; these adapters need only megatron-core.

An adapter adds ``scale * B(A(dropout(x)))`` to a linear's output (``scale = alpha /
rank``; ``A`` is ``[rank, in]``, ``B`` is ``[out, rank]``, ``B`` starts at zero so the
model starts equal to its base). It lives in the wrapped linear as a child module
``lora`` (parameters ``<linear>.lora.A`` / ``<linear>.lora.B``) and runs from a forward
hook, so the base linear stays where it was and its weights keep their canonical names:
loading HF weights, conversion and the resharder see the same base as without LoRA.

Sharding follows the wrapped layer, so the adapter's output is laid out as the layer's:

* column-parallel (``linear_qkv``, ``linear_fc1``): ``A`` replicated, ``B`` split on its
  output dim like the weight (SwiGLU's ``[gate; up]`` pieces each on their own). The input
  is gathered over the sequence (sequence parallelism) as the layer gathers it, whose
  backward reduce-scatters the input gradient; each TP rank's ``A`` gradient covers only
  its ``B`` rows, so it is tagged ``sequence_parallel`` (summed over TP with the norms).
* row-parallel (``linear_proj``, ``linear_fc2``): ``A`` split on its input dim like the
  weight, ``B`` replicated. ``A x`` is a partial sum over TP: reduce-scattered to the
  sequence shard (sequence parallelism; all-reduced without it), then ``B`` runs on
  ``s / tp`` tokens, so its gradient is partial too and tagged the same way.

Both adapter matrices are drawn as full tensors from a generator seeded by the engine seed
and the parameter's canonical name, then sliced: every TP rank, and every layout, starts
from the same adapters. Routed MoE experts get none (``validate_targets`` refuses them).
The base is frozen (``requires_grad`` off): Megatron's linears then take their frozen-weight
path (no weight gradient), optimizers and the gradient reduction see adapters only.
"""

from __future__ import annotations

import contextlib
import math
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from backends.lora_merge import merged_weight
from backends.megatron.layouts import (
    canonical_parameters,
    layout_of,
    tp_rank_for,
    tp_world_for,
)

#: Target name (``actor.lora.targets``) -> the Megatron linear it wraps in every layer.
LAYER_TARGETS = {
    "qkv": "linear_qkv",
    "proj": "linear_proj",
    "fc1": "linear_fc1",
    "fc2": "linear_fc2",
}
#: The output layer (logits) is an opt-in target: a pretrained base's head already
#: speaks the language, but a base whose head was never trained (a random-init model)
#: bounds every token's probability with it frozen (docs/architecture.md §13).
OUTPUT_TARGET, OUTPUT_LAYER = "output", "output_layer"
TARGETS = {**LAYER_TARGETS, OUTPUT_TARGET: OUTPUT_LAYER}
DEFAULT_TARGETS = tuple(LAYER_TARGETS)
ADAPTER = "lora"  # the child module's name inside a wrapped linear
ROUTED_EXPERTS = ".experts."


@dataclass(frozen=True)
class LoRASpec:
    """Adapters of a trained role.

    Attributes:
        rank: inner dimension of each adapter (> 0).
        alpha: the adapter's output is scaled by ``alpha / rank``.
        dropout: dropout on the adapter's input while training.
        targets: which linears of every layer get one (keys of :data:`TARGETS`).
    """

    rank: int
    alpha: float
    dropout: float = 0.0
    targets: tuple[str, ...] = DEFAULT_TARGETS

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def validate_targets(targets: tuple[str, ...] | list[str]) -> None:
    """Refuse target names that are not :data:`TARGETS` (routed experts in particular).

    Raises:
        ValueError: one line naming the bad target and the choices.
    """
    for target in targets:
        if "expert" in target:
            raise ValueError(
                f"lora target '{target}': MoE experts cannot take adapters; "
                f"choose from {', '.join(TARGETS)}"
            )
        if target not in TARGETS:
            raise ValueError(f"unknown lora target '{target}'; choose from {', '.join(TARGETS)}")


class LoRAAdapter(nn.Module):
    """The ``A`` / ``B`` pair of one column- or row-parallel linear (see the module doc).

    Args:
        base: the wrapped ``ColumnParallelLinear`` / ``RowParallelLinear``.
        column: ``base`` is column-parallel (else row-parallel).
        spec: rank, alpha, dropout.
        sequence_parallel: the model runs with sequence parallelism.
    """

    def __init__(
        self, base: nn.Module, column: bool, spec: LoRASpec, sequence_parallel: bool
    ) -> None:
        from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

        super().__init__()
        self.column, self.sequence_parallel = column, sequence_parallel
        self.scale, self.enabled = spec.scale, True
        self.dropout = nn.Dropout(spec.dropout) if spec.dropout > 0 else nn.Identity()
        out_local, in_local = base.weight.shape
        like = {"dtype": base.weight.dtype, "device": base.weight.device}
        self.A = nn.Parameter(torch.zeros(spec.rank, in_local, **like))
        self.B = nn.Parameter(torch.zeros(out_local, spec.rank, **like))
        split, replicated = (self.B, self.A) if column else (self.A, self.B)
        stride = getattr(base.weight, "partition_stride", 1) if column else 1
        set_tensor_model_parallel_attributes(split, True, 0 if column else 1, stride)
        # Each TP rank's gradient of the replicated matrix is a partial sum (see the
        # module doc); Megatron's tag for "sum over TP" is the sequence-parallel one.
        replicated.sequence_parallel = sequence_parallel

    def forward(self, x: torch.Tensor, sequence_parallel: bool | None = None) -> torch.Tensor:
        """The adapter's part of the wrapped layer's output for the layer's input ``x``
        (``sequence_parallel``: whether ``x`` is split over the sequence right now, which
        the logit window turns off on the output layer; ``None``: the model's setting)."""
        from megatron.core import tensor_parallel as tp

        if sequence_parallel is None:
            sequence_parallel = self.sequence_parallel
        if self.column:
            if sequence_parallel:
                x = tp.gather_from_sequence_parallel_region(x, tensor_parallel_output_grad=True)
            else:
                x = tp.copy_to_tensor_model_parallel_region(x)
            return self.scale * (self.dropout(x) @ self.A.t()) @ self.B.t()
        inner = self.dropout(x) @ self.A.t()
        if sequence_parallel:
            inner = tp.reduce_scatter_to_sequence_parallel_region(inner)
        else:
            inner = tp.reduce_from_tensor_model_parallel_region(inner)
        return self.scale * inner @ self.B.t()


def _add_adapter_output(module: nn.Module, args: tuple, output: tuple) -> tuple:
    """Forward hook of a wrapped linear: ``(out, bias)`` -> ``(out + adapter(x), bias)``."""
    adapter = getattr(module, ADAPTER)
    if not adapter.enabled:
        return output
    out, bias = output
    now = getattr(module, "sequence_parallel", None)
    return out + adapter(args[0], now).to(out.dtype), bias


def add_adapters(model: nn.Module, spec: LoRASpec, seed: int) -> list[str]:
    """Freeze ``model`` and give every targeted linear of every layer an adapter.

    Returns:
        The local module names that got one.

    Raises:
        ValueError: a target matches no linear of this model (a silent no-op adapter
            would train nothing), or a matched module is not a Megatron parallel linear.
    """
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    validate_targets(spec.targets)
    tied = getattr(model, "share_embeddings_and_output_weights", False)
    if OUTPUT_TARGET in spec.targets and tied:
        raise ValueError(
            "lora target 'output': this model's output layer is its input embedding "
            "(tied), so an adapter merged into it would change the embedding too; "
            "remove 'output' from actor.lora.targets"
        )
    sequence_parallel = bool(model.config.sequence_parallel)
    for param in model.parameters():
        param.requires_grad_(False)
    wrapped, found = [], dict.fromkeys(spec.targets, 0)
    for name, module in list(model.named_modules()):
        target = _target_of(name, spec.targets)
        if target is None:
            continue
        if not isinstance(module, (ColumnParallelLinear, RowParallelLinear)):
            raise ValueError(
                f"lora target '{target}' ({name}) is a {type(module).__name__}, not a Megatron "
                "column/row-parallel linear; LoRA runs on the local (non-TransformerEngine) spec"
            )
        column = isinstance(module, ColumnParallelLinear)
        module.add_module(ADAPTER, LoRAAdapter(module, column, spec, sequence_parallel))
        module.register_forward_hook(_add_adapter_output)
        wrapped.append(name)
        found[target] += 1
    missing = [t for t, n in found.items() if n == 0 and _stage_should_hold(model, t)]
    if missing:
        raise ValueError(
            f"lora targets {missing} match no linear of this model "
            f"(its layers have {sorted(_linear_kinds(model))}); remove them from actor.lora.targets"
        )
    init_adapters(model, seed)
    return wrapped


def _target_of(module_name: str, targets: tuple[str, ...]) -> str | None:
    leaf = module_name.rsplit(".", 1)[-1]
    if leaf == OUTPUT_LAYER:
        return OUTPUT_TARGET if OUTPUT_TARGET in targets else None
    if ROUTED_EXPERTS in module_name or ".layers." not in f".{module_name}":
        return None
    return next((t for t in targets if TARGETS[t] == leaf), None)


def _stage_should_hold(model: nn.Module, target: str) -> bool:
    """Whether this pipeline stage has the linear ``target`` names (the output layer is
    on the last stage only; a stage may hold no layers at all)."""
    names = [n for n, _ in model.named_modules()]
    if target == OUTPUT_TARGET:
        return any(n.rsplit(".", 1)[-1] == OUTPUT_LAYER for n in names)
    return any(".layers." in f".{n}" for n in names)


def _linear_kinds(model: nn.Module) -> set[str]:
    return {n.rsplit(".", 1)[-1] for n, _ in model.named_modules() if ".linear_" in f".{n}"}


def is_adapter_name(name: str) -> bool:
    """A canonical (or local) parameter name of an adapter matrix."""
    return f".{ADAPTER}.A" in name or f".{ADAPTER}.B" in name


def adapters(model: nn.Module) -> Iterator[LoRAAdapter]:
    return (m for m in model.modules() if isinstance(m, LoRAAdapter))


def has_adapters(model: nn.Module) -> bool:
    return next(adapters(model), None) is not None


@torch.no_grad()
def init_adapters(model: nn.Module, seed: int) -> None:
    """``A`` uniform in ``±1/sqrt(in)`` (PEFT's Kaiming init), ``B`` zero: drawn full per
    canonical name and sliced, so every TP rank and every layout holds the same adapters."""
    from backends.megatron.sharding import shard_tensor

    for name, param in canonical_parameters(model).items():
        if not name.endswith(f".{ADAPTER}.A"):
            continue
        layout = layout_of(name, param)
        gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
        bound = 1.0 / math.sqrt(layout.full_shape[1])
        full = (torch.rand(layout.full_shape, generator=gen, dtype=torch.float64) * 2 - 1) * bound
        shard = shard_tensor(full, layout, tp_rank_for(param), tp_world_for(param))
        param.copy_(shard.to(param.dtype))


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """The base model alone inside the block (the adapters add nothing)."""
    switched = list(adapters(model))
    for adapter in switched:
        adapter.enabled = False
    try:
        yield
    finally:
        for adapter in switched:
            adapter.enabled = True


class MergedWeights(Mapping):
    """Full canonical tensors (a checkpoint's ``model/`` tensors, read on access) as the
    policy: each wrapped weight with its adapters merged in (``merged_weight``), the
    adapters themselves not listed. What an HF export of a LoRA checkpoint writes, and
    the engine's :meth:`~backends.megatron.engine.MegatronEngine.policy_state_dict`."""

    def __init__(self, full: Mapping[str, torch.Tensor], scale: float) -> None:
        self.full, self.scale = full, scale

    def _adapter(self, name: str) -> str | None:
        prefix = name.removesuffix(".weight")
        return prefix if f"{prefix}.{ADAPTER}.A" in self.full else None

    def __getitem__(self, name: str) -> torch.Tensor:
        if is_adapter_name(name):
            raise KeyError(name)
        weight, prefix = self.full[name], self._adapter(name)
        if prefix is None or not name.endswith(".weight"):
            return weight
        a, b = (self.full[f"{prefix}.{ADAPTER}.{m}"] for m in ("A", "B"))
        return merged_weight(weight, a, b, self.scale)

    def __iter__(self) -> Iterator[str]:
        return (name for name in self.full if not is_adapter_name(name))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def trainable_count(model: nn.Module) -> int:
    """Elements of this rank's trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
