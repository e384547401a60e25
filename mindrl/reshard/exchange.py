"""How a bucket's shards reach every rank: process groups, or a one-process simulation.

Both exchanges return the same ``[group_size, row_numel]`` device buffer for a bucket:
row ``m`` holds what member ``m`` of the bucket's gather group (training TP group for
dense buckets, expert ETP x EP group for expert buckets) contributes. With training
PP > 1 the stage that owns the bucket gathers it and broadcasts it down the pipeline
groups, so every rank ends with the full bucket (generation has PP = 1).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from backends.device import Device
from backends.layout import ParamLayout
from mindrl.reshard.layouts import LayoutError, TrainLayout
from mindrl.reshard.plan import Bucket, ParamInfo, build_table, pack_row
from mindrl.reshard.slicing import shard_shape, take_shard

ShardSource = Callable[[ParamInfo, int], torch.Tensor]


def _new_buffer(bucket: Bucket, device: Device) -> torch.Tensor:
    buffer = torch.zeros(
        (len(bucket.rows), bucket.row_numel), dtype=bucket.dtype, device=device.device()
    )
    device.track(buffer)
    return buffer


def _my_subgroup(groups: list[list[int]], rank: int) -> tuple[list[int], object]:
    """Create every group (all ranks must, in the same order) and keep the one with ``rank``."""
    mine: tuple[list[int], object] | None = None
    for ranks in groups:
        handle = dist.new_group(ranks) if len(groups[0]) > 1 else None
        if rank in ranks:
            mine = (ranks, handle)
    return mine


def _all_gather_flat(output: torch.Tensor, send: torch.Tensor, group: object) -> None:
    # torch 2.13 renamed all_gather_into_tensor; older accelerator builds only have it.
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(output, send, group=group)


class ProcessGroupExchange:
    """All-gather over the training TP / expert groups, broadcast along pipeline groups."""

    def __init__(self, train: TrainLayout, rank: int, device: Device) -> None:
        self.train, self.rank, self.device = train, rank, device
        self._groups = {
            "dense": _my_subgroup(train.tp_groups(), rank),
            "expert": _my_subgroup(train.expert_groups(), rank),
        }
        self._pp = _my_subgroup(train.pp_groups(), rank)

    def gather(self, bucket: Bucket, shard_of: ShardSource) -> torch.Tensor:
        gathered = _new_buffer(bucket, self.device)
        if self.train.pp_rank(self.rank) == bucket.stage:
            ranks, group = self._groups[bucket.kind]
            member = ranks.index(self.rank)
            if group is None:
                pack_row(gathered[0], bucket.rows[0], shard_of)
            else:
                send = torch.zeros(bucket.row_numel, dtype=bucket.dtype, device=gathered.device)
                self.device.track(send)
                pack_row(send, bucket.rows[member], shard_of)
                _all_gather_flat(gathered.view(-1), send, group)
                send.untyped_storage().resize_(0)  # see _gather_and_copy: free it now
        pp_ranks, pp_group = self._pp
        if pp_group is not None:
            dist.broadcast(gathered, src=pp_ranks[bucket.stage], group=pp_group)
        return gathered


class LocalExchange:
    """Builds every member's row from full host weights: one rank plays a whole world.

    The buffer it returns holds exactly what :class:`ProcessGroupExchange` would have
    gathered, so device memory on the simulated rank matches a real one.
    """

    def __init__(self, train: TrainLayout, full: dict[str, torch.Tensor], device: Device) -> None:
        self.train, self.full, self.device = train, full, device

    def _peer_shard(self, info: ParamInfo, holder: int) -> torch.Tensor:
        return take_shard(self.full[info.name], info.layout, info.holders(self.train), holder)

    def gather(self, bucket: Bucket, shard_of: ShardSource) -> torch.Tensor:
        gathered = _new_buffer(bucket, self.device)
        for member, slots in enumerate(bucket.rows):
            pack_row(gathered[member], slots, self._peer_shard)
        return gathered


def _local_entries(
    params: dict[str, torch.Tensor], layouts: dict[str, ParamLayout], train: TrainLayout
) -> tuple[list, str | None]:
    """This rank's ``(name, layout, dtype)`` list and the first problem with it, if any."""
    entries, problem = [], None
    for name, tensor in params.items():
        layout = layouts.get(name)
        if layout is None:
            problem = problem or f"parameter '{name}' has no ParamLayout; attach one to every param"
            continue
        parts = train.etp if layout.is_expert else train.tp
        if tuple(tensor.shape) != shard_shape(layout, parts):
            problem = problem or (
                f"parameter '{name}' has shape {tuple(tensor.shape)} but its layout says "
                f"{shard_shape(layout, parts)} per rank; the layout does not match the tensor"
            )
        entries.append((name, layout, str(tensor.dtype).removeprefix("torch.")))
    return entries, problem


def exchange_table(
    params: dict[str, torch.Tensor],
    layouts: dict[str, ParamLayout],
    train: TrainLayout,
    rank: int,
) -> dict[str, ParamInfo]:
    """Every rank's parameter list, merged into one table (one ``all_gather_object``).

    Every rank raises the same :class:`LayoutError` if any rank's input is inconsistent,
    so no rank is left waiting in a later collective.
    """
    mine = _local_entries(params, layouts, train)
    everyone: list = [None] * train.world
    dist.all_gather_object(everyone, mine)
    merged: dict[str, tuple] = {}
    for other, (entries, problem) in enumerate(everyone):
        if problem:
            raise LayoutError(f"rank {other}: {problem}")
        for name, layout, dtype in entries:
            stage = train.pp_rank(other)
            previous = merged.setdefault(name, (name, layout, getattr(torch, dtype), stage))
            if previous[1] != layout or previous[3] != stage:
                raise LayoutError(
                    f"parameter '{name}' has different layouts or stages on different ranks "
                    f"(rank {other}: {layout}, stage {stage}); names must be global"
                )
    return build_table(merged.values())
