"""One rank's measurement for ``benchmarks/reshard.py``: naive vs allgather–swap.

Both resharders run in the same process on fresh copies of the same training shards;
between them every device tensor of the first is released, so the second starts from
the same baseline. A plain pinned copy of the swapped byte count is timed in the same
run as the bandwidth reference.
"""

from __future__ import annotations

import functools
import gc
import time
from dataclasses import dataclass

import torch

from backends.device import get_device
from benchmarks.harness.synthetic_model import stage_of, synthetic_weights
from mindrl.config import ModelConfig
from mindrl.reshard.allgather_swap import AllgatherSwapResharder
from mindrl.reshard.layouts import GenLayout, ModelShape, TrainLayout
from mindrl.reshard.naive import NaiveResharder
from mindrl.reshard.plan import build_table
from mindrl.reshard.resharder import BaseResharder, local_training_shards


@dataclass(frozen=True)
class MeasureSpec:
    model: ModelConfig
    train: TrainLayout
    gen: GenLayout
    bucket_bytes: int
    simulate_rank: int | None = None  # one process playing this rank of the world


def _distinct_bytes(tensors) -> int:
    return sum({t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in tensors}.values())


def _build(cls: type, spec: MeasureSpec, full: dict, layouts: dict, rank: int) -> BaseResharder:
    where = functools.partial(stage_of, m=spec.model, pp=spec.train.pp)
    kwargs = {"model": ModelShape.from_config(spec.model), "bucket_bytes": spec.bucket_bytes}
    if spec.simulate_rank is not None:
        return cls.simulated(full, layouts, where, spec.train, spec.gen, rank, **kwargs)
    device = get_device()
    table = build_table((n, layouts[n], t.dtype, where(n)) for n, t in full.items())
    params = local_training_shards(full, table, spec.train, rank, device)
    return cls(params, layouts, spec.train, spec.gen, rank=rank, table=table, **kwargs)


def _run_one(cls: type, spec: MeasureSpec, full: dict, layouts: dict, rank: int) -> dict:
    device = get_device()
    resharder = _build(cls, spec, full, layouts, rank)
    train_bytes = _distinct_bytes(resharder.params.values())
    out = resharder.reshard()  # warm-up: allocates generation and pinned buffers
    if isinstance(resharder, AllgatherSwapResharder):
        resharder.swap_in()
    device.synchronize()
    device.reset_peak_memory_stats()
    start = time.perf_counter()
    out = resharder.reshard(out)
    seconds = time.perf_counter() - start
    generation_stage = device.memory_allocated()
    result = {
        "train_bytes": train_bytes,
        "generation_shard_bytes": _distinct_bytes(out.values()),
        "generation_stage_bytes": generation_stage,
        "redundant_bytes": generation_stage - _distinct_bytes(out.values()),
        "reshard_peak_bytes": device.max_memory_allocated(),
        "reshard_seconds": seconds,
        "timeline": list(resharder.timeline.steps),
        "buckets": len(resharder.buckets),
    }
    if isinstance(resharder, AllgatherSwapResharder):
        result |= _swap_figures(resharder)
    del out, resharder
    gc.collect()
    return result


def _swap_figures(resharder: AllgatherSwapResharder) -> dict:
    swapped = resharder.swapped_bytes
    swap_out_s = resharder.seconds["swap_out"]
    resharder.swap_in()
    swap_in_s = resharder.seconds["swap_in"]
    return {
        "swapped_bytes": swapped,
        "swap_out_seconds": swap_out_s,
        "swap_in_seconds": swap_in_s,
        "swap_out_gbps": swapped / swap_out_s / 1e9,
        "swap_in_gbps": swapped / swap_in_s / 1e9,
        "gather_seconds": resharder.seconds["gather"],
    }


def pinned_copy_gbps(nbytes: int, repeats: int = 3) -> dict:
    """Best-of-``repeats`` bandwidth of one contiguous device<->pinned-host copy."""
    device = get_device()
    on_device = torch.empty(nbytes, dtype=torch.uint8, device=device.device())
    host = device.pinned_empty((nbytes,), torch.uint8)
    best = {"d2h": 0.0, "h2d": 0.0}
    for _ in range(repeats + 1):  # first round warms up
        for name, dst, src in (("d2h", host, on_device), ("h2d", on_device, host)):
            device.synchronize()
            start = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            device.synchronize()
            best[name] = max(best[name], nbytes / (time.perf_counter() - start) / 1e9)
    return {"pinned_d2h_gbps": best["d2h"], "pinned_h2d_gbps": best["h2d"]}


def measure_rank(rank: int, world: int, spec: MeasureSpec) -> dict:
    """Naive then allgather–swap on this rank (or on the simulated rank)."""
    torch.manual_seed(0)
    rank = rank if spec.simulate_rank is None else spec.simulate_rank
    full, layouts = synthetic_weights(spec.model, seed=11)
    naive = _run_one(NaiveResharder, spec, full, layouts, rank)
    swap = _run_one(AllgatherSwapResharder, spec, full, layouts, rank)
    return {"rank": rank, "naive": naive, "allgather_swap": swap} | pinned_copy_gbps(
        max(swap["swapped_bytes"], 1)
    )
