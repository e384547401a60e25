"""Multi-rank tests run in processes of their own, one torch thread per rank (CPU by default:
forked from a fork server that imported torch and Megatron once).

A thin pin of :func:`benchmarks.harness.spawn.run_ranks`, the one spawner the benchmarks use
too: ``run_ranks(fn, world, *args)`` returns ``[fn(rank, world, *args) for each rank]``.
With ``device="cuda"`` / ``"npu"`` each rank takes device ``rank`` (NCCL / HCCL); its
results are moved to the CPU before they leave the rank.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from benchmarks.harness import spawn


def on_cpu(value: Any) -> Any:
    """``value`` with every tensor inside (dicts, lists, tuples) moved to the CPU."""
    if torch.is_tensor(value):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: on_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(on_cpu(v) for v in value)
    return value


def _returning_cpu_tensors(fn: Any, rank: int, world: int, *args: Any) -> Any:
    return on_cpu(fn(rank, world, *args))


def run_ranks(
    fn: Any, world: int, *args: Any, timeout_s: float = 240.0, device: str = "cpu"
) -> list[Any]:
    wrapped = functools.partial(_returning_cpu_tensors, fn)
    return spawn.run_ranks(wrapped, world, *args, device=device, threads=1, timeout_s=timeout_s)
