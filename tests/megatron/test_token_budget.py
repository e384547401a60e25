"""Micro-batches by token budget (``MicroBatching.max_tokens``, backends/megatron/batch.py):
whole rows packed up to the budget as the packed row counts them, a GRPO group together
where it fits, and a step identical to fixed-size micro-batches in float64 (log-probs,
entropy, values, loss and every gradient) on two data-parallel ranks (packed and
right-padded rows) and on a pipeline."""

from __future__ import annotations

import pytest
import torch

from backends.megatron.batch import rows_by_tokens, split_to_count
from backends.megatron.packing import pack_micro_batch, prompt_groups
from tests.megatron import token_budget_cases as cases
from tests.support.spawn import run_ranks

EXACT = {"rtol": 1e-9, "atol": 1e-12}


def packed_tokens(batch, rows: list[int]) -> int:
    return pack_micro_batch(batch.rows(rows), share_prompts=True).real_tokens


def test_a_budget_packs_whole_groups_and_bounds_the_packed_row():
    batch = cases.groups_batch(vocab=96, seed=20)
    groups = prompt_groups(batch)
    starts, lengths = batch.response_start.tolist(), batch.response_len.tolist()

    micro_batches = rows_by_tokens(groups, starts, lengths, max_tokens=24)

    assert sorted(row for rows in micro_batches for row in rows) == list(range(len(batch)))
    assert all(packed_tokens(batch, rows) <= 24 for rows in micro_batches)
    for group in groups:  # a group that fits the budget is never split
        whole = starts[group[0]] + sum(lengths[row] for row in group)
        holders = [rows for rows in micro_batches if set(rows) & set(group)]
        assert len(holders) == 1 or whole > 24


def test_a_group_longer_than_the_budget_is_cut_into_runs_that_each_carry_the_prompt():
    # one prompt of 4 tokens, responses of 3, 3, 3, 3: 16 packed tokens, budget 10
    micro_batches = rows_by_tokens([[0, 1, 2, 3]], [4] * 4, [3] * 4, max_tokens=10)
    assert micro_batches == [[0, 1], [2, 3]]


def test_a_row_longer_than_the_budget_runs_alone_and_the_others_fill_first_fit():
    prompts, responses = [2, 2, 2, 2], [30, 5, 4, 3]
    micro_batches = rows_by_tokens([[0], [1], [2], [3]], prompts, responses, max_tokens=12)
    assert micro_batches == [[0], [1, 3], [2]]  # 32 alone; 7 + 6 > 12, 7 + 5 = 12 fits


def test_micro_batches_are_cut_to_the_count_another_rank_needs():
    assert split_to_count([[0, 1, 2, 3], [4]], 4) == [[0], [1], [2, 3], [4]]
    with pytest.raises(ValueError, match="2 rows cannot fill 3 micro-batches"):
        split_to_count([[0], [1]], 3)


@pytest.fixture(scope="module")
def two_ranks():
    return run_ranks(cases.budget_and_rows, 2)


@pytest.mark.parametrize("case", ["dp2", "dp2_scalar", "dp2_critic", "dp2_padded", "pp2"])
def test_a_budgeted_step_scores_and_trains_like_fixed_micro_batches(two_ranks, case):
    for rank in range(2):
        rows, budget = two_ranks[rank][case, False], two_ranks[rank][case, True]
        assert budget["micro_batches"] != rows["micro_batches"]  # the cut really differs
        for key, value in rows["scored"].items():
            assert value.dtype == torch.float64
            torch.testing.assert_close(budget["scored"][key], value, **EXACT)
        assert budget["loss"] == pytest.approx(rows["loss"], rel=1e-12)
        assert budget["grad_norm"] == pytest.approx(rows["grad_norm"], rel=1e-12)
        assert budget["grads"].keys() == rows["grads"].keys()
        for name, grad in rows["grads"].items():
            torch.testing.assert_close(budget["grads"][name], grad, **EXACT, msg=name)
