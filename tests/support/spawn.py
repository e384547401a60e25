"""Multi-rank tests run on the CPU over gloo, one torch thread per rank.

A thin pin of :func:`mindrl.workers.spawn.run_ranks`, the one spawner the benchmarks use
too: ``run_ranks(fn, world, *args)`` returns ``[fn(rank, world, *args) for each rank]``.
"""

from __future__ import annotations

from typing import Any

from mindrl.workers import spawn


def run_ranks(fn: Any, world: int, *args: Any, timeout_s: float = 240.0) -> list[Any]:
    return spawn.run_ranks(fn, world, *args, device="cpu", threads=1, timeout_s=timeout_s)
