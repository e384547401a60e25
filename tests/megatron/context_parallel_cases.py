"""Run inside spawned ranks by test_context_parallel.py: a packed row split over context-
parallel ranks scores and trains like the whole row on one rank, in float64."""

from __future__ import annotations

import torch
import torch.distributed as dist

from backends.megatron.attention import (
    PackedMask,
    attend,
    context_parallel_attention,
    context_parallel_positions,
    ulysses_divides,
)

#: A shared-prompt group (prompt 3, responses 4 and 2), a plain document of 10, a shared
#: group (prompt 2, responses 1 and 1) and a 1-token pad: 24 positions, so at cp 2 and 4
#: (contiguous or 2 * cp chunks) documents cross every shard boundary.
ROW_DOCUMENTS = [0] * 9 + [1] * 10 + [2] * 4 + [3]
ROW_MEMBERS = [0, 0, 0, 1, 1, 1, 1, 2, 2] + [0] * 10 + [0, 0, 1, 2] + [0]
HEADS, WIDTH = 4, 8


def crossing_mask() -> PackedMask:
    return PackedMask.of(torch.tensor([ROW_DOCUMENTS]), torch.tensor([ROW_MEMBERS]))


def attention_shards(rank: int, world: int, kv_heads: int) -> dict:
    """This CP rank's attention output and q / k / v grads at its positions, and the whole
    row's on one rank (the reference), for ``kv_heads`` key / value heads."""
    mask, length = crossing_mask(), len(ROW_DOCUMENTS)
    gen = torch.Generator().manual_seed(5)
    shapes = [(length, 1, HEADS, WIDTH)] + [(length, 1, kv_heads, WIDTH)] * 2
    whole = [torch.randn(shape, generator=gen, dtype=torch.float64) for shape in shapes]
    upstream = torch.randn(length, 1, HEADS, WIDTH, generator=gen, dtype=torch.float64)

    leaves = [t.clone().requires_grad_() for t in whole]
    out = attend(*(t.permute(1, 2, 0, 3) for t in leaves), mask, WIDTH**-0.5).permute(2, 0, 1, 3)
    out.backward(upstream)
    reference = {"out": out.detach(), "grads": [t.grad for t in leaves]}

    balanced = not ulysses_divides(kv_heads, world)
    positions = context_parallel_positions(length, world, rank, balanced)
    shards = [t[positions].clone().requires_grad_() for t in whole]
    out = context_parallel_attention(*shards, mask, WIDTH**-0.5, dist.group.WORLD)
    out.backward(upstream[positions])
    return {
        "positions": positions,
        "out": out.detach(),
        "grads": [t.grad for t in shards],
        "reference": reference,
    }


def attention_on_cp_ranks(rank: int, world: int) -> dict:
    """Ulysses (kv heads divide over the ranks) and the K / V gather (they do not)."""
    kv_choices = {2: (2, 1), 4: (4, 2)}[world]
    return {kv: attention_shards(rank, world, kv) for kv in kv_choices}
