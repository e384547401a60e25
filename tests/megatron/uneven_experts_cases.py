"""Run inside spawned ranks by test_uneven_experts.py: MoE at ep 2 whose two data-parallel
ranks pack rows of different lengths trains like one rank on the whole batch (float64)."""

from __future__ import annotations

from dataclasses import replace

import torch.distributed as dist

from backends.megatron import MegatronEngine, ParallelSpec
from backends.megatron.builder import destroy_parallel
from tests.megatron.cases import (
    MOE,
    NO_CLIP,
    batches,
    full_weights_for,
    micro_batch,
    train_and_gather,
)

SPEC = replace(MOE, dtype="float64")


def uneven_batch():
    """Two micro-batches of two rows; the second's responses are 4 tokens shorter, so its
    packed row is 8 positions shorter than the first's."""
    batch = batches(SPEC)
    batch.response_mask[2:, -4:] = 0.0
    return batch


def moe_step(rank: int, world: int) -> dict:
    """One train step of :func:`uneven_batch`: on one rank the whole batch; on two ranks
    (ep 2, dp 2) each rank its own micro-batch."""
    from megatron.core import parallel_state as ps

    full = full_weights_for(SPEC)
    engine = MegatronEngine(SPEC, ParallelSpec(ep=world), NO_CLIP)
    engine.load_full_state_dict(full)
    batch = uneven_batch()
    if world > 1:
        batch = micro_batch(batch, ps.get_data_parallel_rank())
    result = train_and_gather(engine, batch)
    destroy_parallel()
    dist.barrier()
    return result
