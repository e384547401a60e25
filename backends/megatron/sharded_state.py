"""This rank's boxes of the canonical tensors a sharded checkpoint holds.

Tensors, each full and canonical (``layouts.py``: global layer and expert indexes), so a
checkpoint does not depend on the TP / PP / EP / DP layout or the optimizer that wrote it:

========================  ==============================================================
``model/<name>``           the weight
``optim/exp_avg/<name>``   Adam's first moment, shaped as the weight (float32)
``optim/exp_avg_sq/...``   Adam's second moment
``optim/step/<name>``      Adam's step count of that weight (a 0-d tensor)
``optim/main/<name>``      the fp32 main weight of a 16-bit model (distributed optimizer)
========================  ==============================================================

Where a rank's tensors lie in the full tensor (:class:`Placement`): a TP shard is one block
along the partition dim per fused piece (SwiGLU's ``[gate; up]`` are two, each split on
its own); the vocabulary tensors are stored without the rows that pad the vocabulary to a
multiple of TP (the padding depends on the layout); the last pipeline stage's copy of
tied embeddings is the embedding (loaded from it, never written). AdamW's moments have
the weight's shape, so the weight's boxes. The distributed optimizer keeps a flat range
of each local weight per DP rank (Megatron's ``param_range``): it becomes the boxes of
rows that range covers (:func:`flat_range_boxes`).

Saving, a rank offers only the boxes it writes (:func:`writes`): replicas of a box (DP
replicas, TP ranks of a replicated weight) pick one writer by the box's name, so writing
is spread over the replicas and a background save copies nothing twice to the host.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from backends.megatron.layouts import (
    VOCAB_PARAMS,
    canonical_parameters,
    is_expert_param,
    layout_of,
    tp_rank_for,
    tp_world_for,
)
from backends.megatron.sharded_store import Pieces, box

MODEL = "model/"
EMBEDDING = "embedding.word_embeddings.weight"
ADAM_MOMENTS = ("exp_avg", "exp_avg_sq")


def optim_key(kind: str, name: str) -> str:
    return f"optim/{kind}/{name}"


# ---- where a local tensor lies in the stored full tensor ------------------------------------
@dataclass(frozen=True)
class Placement:
    """This rank's local tensor of one weight inside the stored full tensor.

    Attributes:
        shape: the stored full shape (vocabulary rows unpadded).
        dim: the partition dim, ``None`` for a replicated weight.
        blocks: ``(local_start, stored_start, length)`` along ``dim``.
        split: the weight is split over TP (ETP) ranks (else replicated on them).
    """

    shape: tuple[int, ...]
    dim: int | None
    blocks: tuple[tuple[int, int, int], ...]
    split: bool

    def boxes(
        self, offsets: tuple[int, ...], sizes: tuple[int, ...]
    ) -> Iterator[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
        """The local box ``offsets`` / ``sizes`` as ``(stored offsets, local offsets, sizes)``
        boxes: cut at fused-piece borders and where the vocabulary padding starts."""
        if self.dim is None:
            yield offsets, offsets, sizes
            return
        dim, first, last = self.dim, offsets[self.dim], offsets[self.dim] + sizes[self.dim]
        for local_start, stored_start, length in self.blocks:
            start, stop = max(first, local_start), min(last, local_start + length)
            if start >= stop:
                continue
            stored = stored_start + start - local_start
            stop = min(stop, start + self.shape[dim] - stored)  # no padding rows
            if stop <= start:
                continue
            yield (
                _with(offsets, dim, stored),
                _with(offsets, dim, start),
                _with(sizes, dim, stop - start),
            )


def _with(values: tuple[int, ...], dim: int, value: int) -> tuple[int, ...]:
    return (*values[:dim], value, *values[dim + 1 :])


def placement(name: str, param: nn.Parameter | torch.Tensor, vocab_size: int) -> Placement:
    """Where ``param`` (canonical ``name``, on this rank) lies in its stored full tensor."""
    layout = layout_of(name, param)
    shape = list(layout.full_shape)
    if layout.kind == "vocab":
        shape[0] = min(shape[0], vocab_size)
    dim = layout.partition_dim
    if dim is None:
        return Placement(tuple(shape), None, (), split=False)
    world, rank, pieces = tp_world_for(param), tp_rank_for(param), layout.fused_pieces
    piece = param.shape[dim] // pieces  # this rank's rows of one piece
    blocks = tuple(
        (p * piece, p * layout.full_shape[dim] // pieces + rank * piece, piece)
        for p in range(pieces)
    )
    return Placement(tuple(shape), dim, blocks, split=world > 1)


def flat_range_boxes(
    shape: tuple[int, ...], start: int, stop: int
) -> Iterator[tuple[tuple[int, ...], tuple[int, ...], int]]:
    """The elements ``start .. stop`` of a row-major tensor of ``shape`` as boxes
    ``(offsets, sizes, flat start)``: a part row, whole rows, a part row (recursively),
    each contiguous in the flat order."""
    if start >= stop:
        return
    if len(shape) <= 1:
        yield (start,) if shape else (), (stop - start,) if shape else (), start
        return
    inner = math.prod(shape[1:])
    first, head = divmod(start, inner)
    last, tail = divmod(stop, inner)
    if first == last:
        for offsets, sizes, flat in flat_range_boxes(shape[1:], head, tail):
            yield (first, *offsets), (1, *sizes), first * inner + flat
        return
    if head:
        yield from flat_range_boxes(shape, start, (first + 1) * inner)
        first += 1
    if last > first:
        yield (first, *[0] * (len(shape) - 1)), (last - first, *shape[1:]), first * inner
    if tail:
        yield from flat_range_boxes(shape, last * inner, stop)


# ---- which boxes this rank writes -----------------------------------------------------------
def writes(key: str, param: nn.Parameter | torch.Tensor, split: bool, over_dp: bool) -> bool:
    """Whether this rank writes box ``key`` of ``param``: among the ranks holding the same box
    (the DP / expert-DP replicas when ``over_dp``; the TP / ETP ranks unless ``split``),
    the one the key's hash picks."""
    from megatron.core import parallel_state as ps

    slot, replicas = 0, 1
    if over_dp:
        if is_expert_param(param):
            slot, replicas = (
                ps.get_expert_data_parallel_rank(),
                ps.get_expert_data_parallel_world_size(),
            )
        else:
            slot = ps.get_data_parallel_rank(with_context_parallel=True)
            replicas = ps.get_data_parallel_world_size(with_context_parallel=True)
    if not split:
        world = tp_world_for(param)
        slot, replicas = slot * world + tp_rank_for(param), replicas * world
    return zlib.crc32(key.encode()) % replicas == slot


def stored_name(model: nn.Module, name: str, param: nn.Parameter | torch.Tensor) -> str | None:
    """The name ``param`` is stored under: the last stage's copy of tied embeddings is the
    embedding; ``None`` for a copy (written by the first stage)."""
    if getattr(param, "shared_embedding", False) and not model.pre_process:
        return None
    return name


def _load_name(model: nn.Module, name: str, param) -> str:
    return stored_name(model, name, param) or EMBEDDING


# ---- the model ----------------------------------------------------------------------------
def weight_pieces(model: nn.Module, vocab_size: int, saving: bool) -> dict[str, Pieces]:
    """``model/<name>`` boxes of this rank: views of its weights (to save or load into)."""
    out = {}
    for name, param in canonical_parameters(model).items():
        stored = stored_name(model, name, param) if saving else _load_name(model, name, param)
        if stored is None:
            continue
        where = placement(name, param, vocab_size)
        key = MODEL + stored
        if saving and not writes(key, param, where.split, over_dp=True):
            continue
        out[key] = _pieces(where, param.detach())
    return out


def _pieces(where: Placement, local: torch.Tensor) -> Pieces:
    boxes = {}
    for stored, offsets, sizes in where.boxes((0,) * local.dim(), tuple(local.shape)):
        boxes[stored] = local[box(offsets, sizes)]
    return Pieces(where.shape, boxes)


def vocab_padding(model: nn.Module, vocab_size: int) -> list[torch.Tensor]:
    """Views of this rank's weight rows that only pad the vocabulary (loading leaves them
    alone; they are zeroed, as HF weights are padded)."""
    rows = []
    for name, param in canonical_parameters(model).items():
        if name not in VOCAB_PARAMS or layout_of(name, param).kind != "vocab":
            continue
        where = placement(name, param, vocab_size)
        kept = sum(sizes[0] for _, _, sizes in where.boxes((0, 0), tuple(param.shape)))
        if kept < param.shape[0]:
            # A slice, not a mask: indexing with a mask copies, and the caller writes
            # through these rows. The real rows of a vocab shard are its first ones.
            rows.append(param.detach()[kept:])
    return rows


# ---- AdamW (torch, replicated over DP) ------------------------------------------------------
def adam_pieces(
    model: nn.Module, optimizer: torch.optim.Optimizer, vocab_size: int, saving: bool
) -> dict[str, Pieces]:
    """``optim/*`` boxes of a torch AdamW over this rank's weights (its state must exist)."""
    out = {}
    for name, param in canonical_parameters(model).items():
        state = optimizer.state.get(param)
        stored = stored_name(model, name, param) if saving else _load_name(model, name, param)
        if not state or stored is None:
            continue
        where = placement(name, param, vocab_size)
        for kind in ADAM_MOMENTS:
            key = optim_key(kind, stored)
            if not saving or writes(key, param, where.split, over_dp=True):
                out[key] = _pieces(where, state[kind])
        key = optim_key("step", stored)
        if not saving or writes(key, param, split=False, over_dp=True):
            out[key] = Pieces((), {(): state["step"]})
    return out


def ensure_adam_state(optimizer: torch.optim.Optimizer) -> None:
    """Give every parameter of a torch Adam(W) the state its first step would create (step
    0, zero moments: the same update as none), so a checkpoint can be loaded into it."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            if not optimizer.state.get(param):
                optimizer.state[param] = {
                    "step": torch.zeros((), dtype=torch.float32),
                    "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
                }


# ---- Megatron's distributed optimizer (DP-sharded) -----------------------------------------
def distributed_states(model: nn.Module, chained) -> list[tuple[str, nn.Parameter, dict]]:
    """``(canonical name, weight, state)`` for every weight this DP rank keeps optimizer state
    of, in Megatron's ``ChainedOptimizer`` ``chained`` (its state must exist). The state,
    live tensors flat over the weight's DP ``range`` (``start``, ``stop``, added here):
    ``param`` (the fp32 main shard) and the inner torch AdamW's moments and ``step``.

    Main shards are paired with weights as Megatron's own copy between them pairs them
    (``model_float16_groups`` / ``shard_fp32_from_float16_groups``, and the fp32 groups):
    ``_get_main_param_and_optimizer_states`` looks them up by position in the optimizer's
    groups, which lists a group's fp32 weights first and so mismatches when a 16-bit
    model keeps some weights in fp32 (its norms here).
    """
    names = {id(p): n for n, p in canonical_parameters(model).items()}
    states = []
    for opt in chained.chained_optimizers:
        pairs = [
            *zip(opt.model_float16_groups, opt.shard_fp32_from_float16_groups, strict=True),
            *zip(opt.model_fp32_groups, opt.shard_fp32_groups, strict=True),
        ]
        for weights, mains in pairs:
            for param, main in zip(weights, mains, strict=True):
                span = opt._get_model_param_range_map(param)["param"]
                state = {
                    "param": main,
                    **opt.optimizer.state[main],
                    "range": (span.start, span.end),
                }
                states.append((names[id(param)], param, state))
    return states


def distributed_pieces(
    model: nn.Module, states: list[tuple[str, nn.Parameter, dict]], vocab_size: int, saving: bool
) -> dict[str, Pieces]:
    """``optim/*`` boxes of Megatron's distributed optimizer (:func:`distributed_states`):
    each state's flat DP range as boxes of the full tensor. The fp32 main weights are kept
    only for 16-bit models (for fp32 models they are the weights themselves)."""
    boxes: dict[str, dict] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for name, param, state in states:
        stored = stored_name(model, name, param) if saving else _load_name(model, name, param)
        if stored is None:
            continue
        where = placement(name, param, vocab_size)
        kinds = [*ADAM_MOMENTS] + (["main"] if param.dtype != torch.float32 else [])
        for kind in kinds:
            key = optim_key(kind, stored)
            if saving and not writes(key, param, where.split, over_dp=False):
                continue
            shapes[key] = where.shape
            flat = state["param" if kind == "main" else kind]
            boxes.setdefault(key, {}).update(_flat_boxes(where, param.shape, state["range"], flat))
        key = optim_key("step", stored)
        if "step" in state and (not saving or writes(key, param, split=False, over_dp=False)):
            shapes[key] = ()
            boxes.setdefault(key, {})[()] = state["step"]
    return {key: Pieces(shapes[key], boxes[key]) for key in boxes}


def _flat_boxes(
    where: Placement, shape: torch.Size, span: tuple[int, int], flat: torch.Tensor
) -> dict[tuple[int, ...], torch.Tensor]:
    """Stored offsets -> view of ``flat``, the elements ``span`` of a local weight."""
    start, stop = span
    out = {}
    for local, sizes, first in flat_range_boxes(tuple(shape), start, stop):
        view = flat[first - start : first - start + math.prod(sizes)].view(sizes)
        for stored, offsets, cut in where.boxes(local, sizes):
            inside = [o - b for o, b in zip(offsets, local, strict=True)]
            out[stored] = view[box(inside, cut)]
    return out
