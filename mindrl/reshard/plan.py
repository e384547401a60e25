"""The reshard plan: every parameter of the model, where it lives, and gather buckets.

A bucket is a set of parameters of one pipeline stage, one dtype and one gather kind
(``dense``: gathered over the training TP group; ``expert``: over the expert
ETP x EP group) whose full size stays under the bucket cap. Each group member
contributes one row of a ``[group_size, row_numel]`` buffer: its shard of every
partitioned parameter and a flat chunk of every replicated one (so members carry
equal loads); rows are padded to the longest. All ranks derive the same plan from
the same table, so collectives line up without further negotiation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from backends.layout import ParamLayout
from mindrl.reshard.layouts import GenLayout, LayoutError, TrainLayout, check_partition
from mindrl.reshard.slicing import copy_overlap, expert_owner, shard_shape


@dataclass(frozen=True)
class ParamInfo:
    """One logical parameter of the whole model (global name, e.g. global layer index)."""

    name: str
    layout: ParamLayout
    dtype: torch.dtype
    stage: int
    num_experts: int = 0  # experts in this parameter's family (expert params only)

    @property
    def nbytes(self) -> int:
        return self.layout.numel * self.dtype.itemsize

    def holders(self, train: TrainLayout) -> int:
        """How many ranks split this parameter inside one gather group (TP or ETP)."""
        return train.etp if self.layout.is_expert else train.tp


@dataclass(frozen=True)
class Slot:
    """Where one member's piece of one parameter sits in its bucket row."""

    param: ParamInfo
    holder: int  # tp / etp index of the member for this parameter
    offset: int
    numel: int
    flat_range: tuple[int, int] | None  # replicated params: chunk of the flat tensor


@dataclass
class Bucket:
    stage: int
    kind: str  # "dense" | "expert"
    dtype: torch.dtype
    params: list[ParamInfo] = field(default_factory=list)
    rows: list[list[Slot]] = field(default_factory=list)  # per group member

    @property
    def row_numel(self) -> int:
        return max((s.offset + s.numel for row in self.rows for s in row), default=0)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.params)


def expert_family(name: str, expert_index: int) -> str:
    """The name with its (last) expert-index component replaced by ``*``."""
    parts = name.split(".")
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] == str(expert_index):
            parts[i] = "*"
            break
    return ".".join(parts)


def build_table(
    entries: Iterable[tuple[str, ParamLayout, torch.dtype, int]],
) -> dict[str, ParamInfo]:
    """ParamInfo per name from ``(name, layout, dtype, stage)``, counting expert families."""
    entries = list(entries)
    family_size: dict[str, int] = {}
    for name, layout, _, _ in entries:
        if layout.is_expert:
            key = expert_family(name, layout.expert_index)
            family_size[key] = family_size.get(key, 0) + 1
    table = {}
    for name, layout, dtype, stage in entries:
        experts = family_size[expert_family(name, layout.expert_index)] if layout.is_expert else 0
        table[name] = ParamInfo(name, layout, dtype, stage, experts)
    return table


def check_table(table: dict[str, ParamInfo], train: TrainLayout, gen: GenLayout) -> None:
    """Refuse parameters the pair cannot split (same verdict on every rank)."""
    for info in table.values():
        check_partition(info.name, info.layout, train, gen)
        if info.layout.is_expert:
            for label, ep in (("training", train.ep), ("generation", gen.ep)):
                if info.num_experts % ep:
                    raise LayoutError(
                        f"parameter '{info.name}': {info.num_experts} experts do not split "
                        f"over {label} ep {ep}"
                    )


def _sort_key(info: ParamInfo, train: TrainLayout) -> tuple:
    if not info.layout.is_expert:
        return (info.name,)
    # Interleave owners so a bucket cut leaves members with near-equal rows.
    e, per_rank = info.layout.expert_index, info.num_experts // train.ep
    return (expert_family(info.name, e), e % per_rank, e // per_rank)


def make_buckets(
    table: dict[str, ParamInfo], train: TrainLayout, bucket_bytes: int
) -> list[Bucket]:
    """Greedy buckets per (stage, kind, dtype) in a fixed order; a huge param stands alone."""
    groups: dict[tuple, list[ParamInfo]] = {}
    for info in table.values():
        kind = "expert" if info.layout.is_expert else "dense"
        groups.setdefault((info.stage, kind, str(info.dtype)), []).append(info)
    buckets = []
    for (stage, kind, _), infos in sorted(groups.items()):
        infos.sort(key=lambda i: _sort_key(i, train))
        current: Bucket | None = None
        for info in infos:
            if current is None or (current.params and current.nbytes + info.nbytes > bucket_bytes):
                current = Bucket(stage, kind, info.dtype)
                buckets.append(current)
            current.params.append(info)
    for bucket in buckets:
        bucket.rows = _layout_rows(bucket, train)
    return buckets


def _layout_rows(bucket: Bucket, train: TrainLayout) -> list[list[Slot]]:
    size = train.tp if bucket.kind == "dense" else train.etp * train.ep
    rows: list[list[Slot]] = [[] for _ in range(size)]
    offsets = [0] * size
    for info in bucket.params:
        for member, holder in _members_holding(info, train):
            slot = _slot(info, holder, offsets[member], info.holders(train))
            rows[member].append(slot)
            offsets[member] += slot.numel
    return rows


def _members_holding(info: ParamInfo, train: TrainLayout) -> list[tuple[int, int]]:
    """(member index in the gather group, holder index) for every member holding ``info``."""
    if not info.layout.is_expert:
        return [(t, t) for t in range(train.tp)]
    owner = expert_owner(info.layout.expert_index, info.num_experts, train.ep)
    return [(owner * train.etp + i, i) for i in range(train.etp)]


def _slot(info: ParamInfo, holder: int, offset: int, holders: int) -> Slot:
    numel = info.layout.numel
    if info.layout.partition_dim is not None:
        return Slot(info, holder, offset, numel // holders, None)
    chunk = -(-numel // holders)
    lo, hi = min(holder * chunk, numel), min((holder + 1) * chunk, numel)
    return Slot(info, holder, offset, hi - lo, (lo, hi))


def pack_row(
    row: torch.Tensor, slots: list[Slot], shard_of: Callable[[ParamInfo, int], torch.Tensor]
) -> None:
    """Copy a member's pieces into its flat ``row``; ``shard_of(info, holder)`` gives them."""
    for slot in slots:
        flat = shard_of(slot.param, slot.holder).reshape(-1)
        if slot.flat_range is not None:
            flat = flat[slot.flat_range[0] : slot.flat_range[1]]
        row[slot.offset : slot.offset + slot.numel].copy_(flat)


def member_pieces(gathered: torch.Tensor, bucket: Bucket, train: TrainLayout) -> dict:
    """``{name: [piece per holder]}`` as views into the gathered ``[members, row]`` buffer."""
    pieces: dict[str, list[torch.Tensor]] = {}
    for member, slots in enumerate(bucket.rows):
        for slot in slots:
            view = gathered[member, slot.offset : slot.offset + slot.numel]
            if slot.flat_range is None:
                view = view.view(shard_shape(slot.param.layout, slot.param.holders(train)))
            holder_list = pieces.setdefault(slot.param.name, [None] * slot.param.holders(train))
            holder_list[slot.holder] = view
    return pieces


def generation_parts(info: ParamInfo, gen: GenLayout, rank: int) -> tuple[int, int]:
    """(number of generation shards, this rank's index) for ``info``."""
    if info.layout.is_expert:
        return gen.etp, gen.etp_rank(rank)
    if info.layout.kind == "vocab" and gen.whole_vocab:
        return 1, 0
    return gen.tp, gen.tp_rank(rank)


def generation_needs(info: ParamInfo, gen: GenLayout, rank: int) -> bool:
    """Whether generation rank ``rank`` holds (a shard of) ``info``."""
    if not info.layout.is_expert:
        return True
    return gen.ep_rank(rank) == expert_owner(info.layout.expert_index, info.num_experts, gen.ep)


def generation_shape(info: ParamInfo, gen: GenLayout, rank: int) -> tuple[int, ...]:
    return shard_shape(info.layout, generation_parts(info, gen, rank)[0])


def fill_generation_shard(
    dst: torch.Tensor, info: ParamInfo, pieces: list[torch.Tensor], gen: GenLayout, rank: int
) -> None:
    """Write this rank's generation shard of ``info`` from the gathered holder pieces."""
    if info.layout.partition_dim is None:  # flat chunks, in holder order
        flat, position = dst.view(-1), 0
        for piece in pieces:
            flat[position : position + piece.numel()].copy_(piece)
            position += piece.numel()
        return
    parts, index = generation_parts(info, gen, rank)
    copy_overlap(dst, parts, index, pieces, info.layout)
