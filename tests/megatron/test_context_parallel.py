"""Context parallelism (backends/megatron/attention.py, engine.py): a packed row split over
CP ranks computes, in float64, what one rank computes with the whole row.

The attention alone: Ulysses (all-to-all of heads; kv heads divide over cp) and the K / V
all-gather (balanced 2 * cp chunks; they do not) give each rank the outputs and the q / k
/ v gradients of its positions, on a row whose documents (shared prompts among them) cross
every shard boundary."""

from __future__ import annotations

import pytest
import torch

from backends.megatron.attention import context_parallel_positions
from tests.megatron import context_parallel_cases as cases
from tests.support.spawn import run_ranks

EXACT = {"rtol": 1e-10, "atol": 1e-12}


def test_ulysses_shards_are_contiguous_and_the_fallbacks_pair_cheap_and_expensive_chunks():
    assert context_parallel_positions(8, 2, 1, balanced=False).tolist() == [4, 5, 6, 7]
    assert context_parallel_positions(8, 2, 0, balanced=True).tolist() == [0, 1, 6, 7]
    assert context_parallel_positions(8, 2, 1, balanced=True).tolist() == [2, 3, 4, 5]
    with pytest.raises(ValueError, match="does not split into 4 equal parts"):
        context_parallel_positions(6, 2, 0, balanced=True)


@pytest.fixture(scope="module", params=[2, 4], ids=["cp2", "cp4"])
def attention_ranks(request):
    return request.param, run_ranks(cases.attention_on_cp_ranks, request.param)


def test_each_cp_rank_attends_its_positions_exactly_like_the_whole_row(attention_ranks):
    cp, ranks = attention_ranks
    for rank, result in enumerate(ranks):
        for kv_heads, shard in result.items():
            where = f"cp{cp} rank {rank}, {kv_heads} kv heads"
            positions, reference = shard["positions"], shard["reference"]
            want = reference["out"][positions]
            torch.testing.assert_close(shard["out"], want, **EXACT, msg=where)
            for name, got, want in zip("qkv", shard["grads"], reference["grads"], strict=True):
                torch.testing.assert_close(got, want[positions], **EXACT, msg=f"d{name}, {where}")


def test_the_shards_of_both_paths_cover_the_row_once(attention_ranks):
    cp, ranks = attention_ranks
    for kv_heads in ranks[0]:
        held = torch.cat([ranks[r][kv_heads]["positions"] for r in range(cp)])
        assert sorted(held.tolist()) == list(range(len(cases.ROW_DOCUMENTS)))
