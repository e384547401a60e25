"""What both resharders share: checks, the plan, and the bucketed gather -> copy -> free."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from backends.device import Device, get_device
from backends.layout import ParamLayout
from mindrl.reshard.exchange import LocalExchange, ProcessGroupExchange, exchange_table
from mindrl.reshard.layouts import GenLayout, ModelShape, TrainLayout, check_layout_pair
from mindrl.reshard.plan import (
    ParamInfo,
    build_table,
    check_table,
    fill_generation_shard,
    generation_needs,
    generation_shape,
    make_buckets,
    member_pieces,
)
from mindrl.reshard.slicing import take_shard
from mindrl.reshard.timeline import MemoryTimeline

DEFAULT_BUCKET_BYTES = 512 * 2**20


class BaseResharder:
    """Training shards of one rank -> that rank's generation shards.

    Args:
        params: this rank's training shards, ``{global name: device tensor}`` (global
            layer and expert numbers, Megatron naming).
        layouts: a :class:`ParamLayout` for every name in ``params``.
        train: the training layout.
        gen: the generation layout (same world).
        rank: this rank (default: ``torch.distributed.get_rank()``).
        model: heads / query groups / experts, for the up-front divisibility checks.
        bucket_bytes: cap on the full bytes gathered at once (a single larger
            parameter forms its own bucket).
        exchange: how buckets are gathered (default: over process groups).
        table: the whole model's parameter table (default: exchanged between ranks).
        device: the device layer (default: ``get_device()``).

    Raises:
        LayoutError: the layout pair or a parameter cannot be resharded; raised on every
            rank before any tensor moves (pair checks before any communication at all).
    """

    def __init__(
        self,
        params: dict[str, torch.Tensor],
        layouts: dict[str, ParamLayout],
        train: TrainLayout,
        gen: GenLayout,
        *,
        rank: int | None = None,
        model: ModelShape | None = None,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        exchange: object | None = None,
        table: dict[str, ParamInfo] | None = None,
        device: Device | None = None,
    ) -> None:
        check_layout_pair(train, gen, model)
        self.params, self.layouts, self.train, self.gen = params, layouts, train, gen
        self.device = device or get_device()
        self.rank = dist.get_rank() if rank is None else rank
        self.table = (
            table if table is not None else exchange_table(params, layouts, train, self.rank)
        )
        check_table(self.table, train, gen)
        self.buckets = make_buckets(self.table, train, bucket_bytes)
        self.exchange = exchange or ProcessGroupExchange(train, self.rank, self.device)
        self.timeline = MemoryTimeline(self.device)
        self.device.track(*params.values())

    @classmethod
    def simulated(
        cls,
        full: dict[str, torch.Tensor],
        layouts: dict[str, ParamLayout],
        stage_of: Callable[[str], int],
        train: TrainLayout,
        gen: GenLayout,
        rank: int,
        **kwargs,
    ) -> BaseResharder:
        """One process plays ``rank`` of a whole world: its peers' shards come from ``full``.

        ``full`` holds the full weights on the host; this rank's training shards are cut
        from it and placed on the device, so device memory matches a real rank.
        """
        model = kwargs.get("model")
        check_layout_pair(train, gen, model)
        entries = [(n, layouts[n], t.dtype, stage_of(n)) for n, t in full.items()]
        table = build_table(entries)
        device = kwargs.pop("device", None) or get_device()
        local = local_training_shards(full, table, train, rank, device)
        exchange = LocalExchange(train, full, device)
        return cls(
            local,
            layouts,
            train,
            gen,
            rank=rank,
            table=table,
            exchange=exchange,
            device=device,
            **kwargs,
        )

    # ---- generation buffers -------------------------------------------------------------
    def generation_names(self) -> list[str]:
        """Names this rank holds in the generation stage (all dense, its own experts)."""
        return [n for n, i in self.table.items() if generation_needs(i, self.gen, self.rank)]

    def allocate_generation_buffers(self, exclude: set[str] = frozenset()) -> dict:
        """Empty device tensors for this rank's generation shards (tracked on CPU)."""
        out = {}
        for name in self.generation_names():
            if name in exclude:
                continue
            info = self.table[name]
            shape = generation_shape(info, self.gen, self.rank)
            out[name] = torch.empty(shape, dtype=info.dtype, device=self.device.device())
        self.device.track(*out.values())
        return out

    # ---- steps 1, 2 and 4 ---------------------------------------------------------------
    def _gather_and_copy(self, out: dict[str, torch.Tensor], skip: set[str]) -> None:
        """Per bucket: all-gather (1), copy this rank's shards into ``out`` (2), free (4)."""

        def local_shard(info: ParamInfo, holder: int) -> torch.Tensor:
            return self.params[info.name]

        for index, bucket in enumerate(self.buckets):
            gathered = self.exchange.gather(bucket, local_shard)
            self.timeline.record(f"allgather[{index}]")
            pieces = member_pieces(gathered, bucket, self.train)
            for info in bucket.params:
                if info.name in out and info.name not in skip:
                    fill_generation_shard(
                        out[info.name], info, pieces[info.name], self.gen, self.rank
                    )
            self.timeline.record(f"copy[{index}]")
            # Step 4. Releasing the storage frees it now even if a collective's work
            # object (gloo keeps one on its worker thread) still holds a reference.
            gathered.untyped_storage().resize_(0)
            del pieces, gathered
            self.timeline.record(f"free[{index}]")


def local_training_shards(
    full: dict[str, torch.Tensor],
    table: dict[str, ParamInfo],
    train: TrainLayout,
    rank: int,
    device: Device,
) -> dict[str, torch.Tensor]:
    """The training shards ``rank`` holds under ``train``, cut from full weights.

    Used by the single-process simulation and by tests as the independent reference of
    what a Megatron rank holds.
    """
    local = {}
    for name, info in table.items():
        if info.stage != train.pp_rank(rank):
            continue
        if info.layout.is_expert:
            per_rank = info.num_experts // train.ep
            if info.layout.expert_index // per_rank != train.ep_rank(rank):
                continue
            shard = take_shard(full[name], info.layout, train.etp, train.etp_rank(rank))
        else:
            shard = take_shard(full[name], info.layout, train.tp, train.tp_rank(rank))
        local[name] = shard.to(device.device())
    return local
