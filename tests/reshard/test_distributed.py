"""Allgather–swap over real gloo process groups: 2, 4 and 8 spawned ranks.

One spawn per world size runs a matrix of layout pairs (dense and MoE); each test
below asserts one property over every rank and every pair of that world.
"""

from __future__ import annotations

import pytest

from mindrl.reshard import GenLayout, TrainLayout
from tests.reshard.helpers import BUCKET_BYTES, DENSE, MOE, check_pairs
from tests.support.spawn import run_ranks

CASES = {
    2: [
        ("TP2->TP1", DENSE, TrainLayout(2, tp=2), GenLayout(2, tp=1)),
        ("TP1->TP2", DENSE, TrainLayout(2, tp=1), GenLayout(2, tp=2)),
        ("PP2->PP1", DENSE, TrainLayout(2, pp=2), GenLayout(2, tp=1)),
        ("MoE TP2 EP2->TP1 EP2", MOE, TrainLayout(2, tp=2, ep=2), GenLayout(2, tp=1, ep=2)),
    ],
    4: [
        ("TP4->TP2", DENSE, TrainLayout(4, tp=4), GenLayout(4, tp=2)),
        ("TP2 PP2->TP4", DENSE, TrainLayout(4, tp=2, pp=2), GenLayout(4, tp=4)),
        (
            "Fig3 TP2 EP2 DP2->TP1 EP4 DP4",
            MOE,
            TrainLayout(4, tp=2, ep=2),
            GenLayout(4, tp=1, ep=4),
        ),
        ("MoE ETP2 PP2->TP2 EP1", MOE, TrainLayout(4, tp=2, pp=2, etp=2), GenLayout(4, tp=2)),
    ],
    8: [
        ("TP2 CP2 PP2->TP4 DP2", DENSE, TrainLayout(8, tp=2, cp=2, pp=2), GenLayout(8, tp=4)),
        ("MoE TP2 EP4->TP2 EP8", MOE, TrainLayout(8, tp=2, ep=4), GenLayout(8, tp=2, ep=8)),
        (
            "MoE TP2 PP2 EP2 ETP2->TP1 EP4",
            MOE,
            TrainLayout(8, tp=2, pp=2, ep=2, etp=2),
            GenLayout(8, tp=1, ep=4),
        ),
    ],
}


@pytest.fixture(scope="module", params=sorted(CASES), ids=lambda w: f"world{w}")
def world_results(request):
    """``[(label, facts of rank 0), (label, facts of rank 1), ...]`` for one world size."""
    world = request.param
    cases = [(model, train, gen) for _, model, train, gen in CASES[world]]
    per_rank = run_ranks(check_pairs, world, cases)
    return [
        (f"{label} rank {rank}", per_rank[rank][i])
        for i, (label, *_) in enumerate(CASES[world])
        for rank in range(world)
    ]


def test_every_generation_shard_is_bit_identical_to_direct_slicing(world_results):
    for label, facts in world_results:
        assert facts["mismatched"] == [], label
        assert facts["missing"] == [], label


def test_swap_out_releases_all_training_storage(world_results):
    for label, facts in world_results:
        assert facts["train_bytes"] > 0, label
        assert facts["train_bytes_after_swap_out"] == 0, label
        assert facts["swapped_bytes"] == facts["train_bytes"], label


def test_temporary_buffer_is_gone_after_reshard(world_results):
    for label, facts in world_results:
        assert facts["ledger_after_reshard"] == facts["generation_bytes"], label


def test_gather_buffer_stays_near_the_bucket_cap(world_results):
    for label, facts in world_results:
        steps = dict(facts["timeline"])
        resident = facts["train_bytes"] + facts["generation_bytes"]
        temporary = max(b for s, b in facts["timeline"] if s.startswith("allgather")) - resident
        assert 0 < temporary <= 2 * BUCKET_BYTES, (label, temporary)
        assert steps["swap_out"] == facts["generation_bytes"], label


def test_swap_in_restores_training_weights_bit_exactly(world_results):
    for label, facts in world_results:
        assert facts["bit_exact_after_swap_in"], label
        assert facts["bit_exact_after_second_iteration"], label


def test_pinned_buffers_are_not_reallocated_on_the_second_iteration(world_results):
    for label, facts in world_results:
        assert facts["second_iteration_allocations"] == 0, label
        assert facts["host_buffers_reused"], label
