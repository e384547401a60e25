"""Context parallelism (backends/megatron/attention.py, engine.py): a packed row split over
CP ranks computes, in float64, what one rank computes with the whole row.

The attention alone: Ulysses (all-to-all of heads; kv heads divide over cp) and the K / V
all-gather (balanced 2 * cp chunks; they do not) give each rank the outputs and the q / k
/ v gradients of its positions, on a row whose documents (shared prompts among them) cross
every shard boundary. The engine at tp1 cp2 (Ulysses), tp1 cp4 and tp2 cp2 (the gather: 2
kv heads), pp2 cp2 and MoE at ep2 cp2 against one rank: log-probs, entropy, values, the
loss of every aggregation mode, every gradient and the weights after the steps; a long
prompt leaves a CP rank without a scoring position and nothing hangs."""

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


@pytest.fixture(scope="module")
def one_rank() -> dict:
    (result,) = run_ranks(cases.reference_on_one_rank, 1)
    return result


@pytest.fixture(scope="module")
def two_ranks() -> list:
    return run_ranks(cases.on_two_ranks, 2)


@pytest.fixture(scope="module")
def four_ranks() -> list:
    return run_ranks(cases.on_four_ranks, 4, timeout_s=400.0)


@pytest.fixture(params=[2, 4], ids=["cp2", "cp4"])
def attention_ranks(request, two_ranks, four_ranks):
    ranks = two_ranks if request.param == 2 else four_ranks
    return request.param, [result["attention"] for result in ranks]


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


#: Megatron's router computes its probabilities in float32: an MoE model agrees to
#: float32's precision (as in test_packing.py).
ROUTED = {"rtol": 1e-6, "atol": 1e-8}
TIGHT = {"rtol": 1e-9, "atol": 1e-12}


def assert_same_steps(got: dict, want: dict, tol: dict = TIGHT) -> None:
    """Per batch: scores, every step's loss, grad norm and grads; the final weights."""
    batches = [key for key in want if key in ("grpo", "long_prompt")]
    assert batches
    for batch in batches:
        for key, value in want[batch]["scored"].items():
            torch.testing.assert_close(got[batch]["scored"][key], value, **tol, msg=key)
        steps = [key for key in want[batch] if key != "scored"]
        assert steps
        for step in steps:
            mine, theirs = got[batch][step], want[batch][step]
            assert mine["loss"] == pytest.approx(theirs["loss"], rel=tol["rtol"], abs=1e-12)
            assert mine["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=tol["rtol"])
            # (a pipeline's last stage also reports its copy of a tied embedding's grad)
            assert mine["grads"].keys() >= theirs["grads"].keys()
            for name, grad in theirs["grads"].items():
                where = f"{batch} {step} {name}"
                torch.testing.assert_close(mine["grads"][name], grad, **tol, msg=where)
    for name, weight in want["weights"].items():
        torch.testing.assert_close(got["weights"][name], weight, **tol, msg=name)


#: layout -> (world, the reference's world and layout)
LAYOUTS = {
    "cp2": (2, 1, "dense"),
    "cp4": (4, 1, "dense"),
    "tp2_cp2": (4, 2, "tp2"),
    "pp2_cp2": (4, 1, "dense"),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_cp_layout_scores_and_trains_exactly_like_cp1(one_rank, two_ranks, four_ranks, layout):
    world, reference_world, reference = LAYOUTS[layout]
    by_world = {1: [one_rank], 2: two_ranks, 4: four_ranks}
    for rank, result in enumerate(by_world[world]):
        want = by_world[reference_world][rank % reference_world][reference]
        for scenario, steps in result[layout].items():
            assert_same_steps(steps, want[scenario])


def test_moe_at_ep2_cp2_scores_and_trains_like_one_rank(one_rank, two_ranks):
    for result in two_ranks:
        assert_same_steps(result["moe_ep2_cp2"], one_rank["moe"], ROUTED)


def test_cp_ranks_of_a_replica_are_one_data_parallel_rank(two_ranks, four_ranks):
    assert [r["cp2"]["policy"]["dp"] for r in two_ranks] == [(0, 1), (0, 1)]
    assert [r["cp4"]["policy"]["dp"] for r in four_ranks] == [(0, 1)] * 4


def test_a_step_counts_the_rows_tokens_once_over_the_cp_group(one_rank, two_ranks, four_ranks):
    # 28 real tokens with each prompt once; cp2 pads the row to 28, cp4 (8 chunks) to 32.
    def tokens(result: dict) -> tuple:
        return result["policy"]["grpo"]["token-mean"]["tokens"]

    assert tokens(one_rank["dense"]) == (28, 28)
    assert tokens(two_ranks[0]["cp2"]) == (28, 28)
    assert tokens(four_ranks[0]["cp4"]) == (32, 28)


def test_a_long_prompt_leaves_the_first_cp2_shard_without_a_scored_token():
    from backends.megatron.packing import ContextSplit, pack_micro_batch

    row = pack_micro_batch(cases.long_prompt_batch(96), share_prompts=True, multiple=2)
    first = ContextSplit(size=2, rank=0, balanced=False).shard(row)
    assert not first.held.any()  # the scenarios above run it: it joins every collective
