"""Rows that share a prompt, packed into one row, score and train exactly like the rows.

GRPO's N responses to a prompt run the prompt once (backends/megatron/shared_prompt.py):
the log-probs, entropies, values, loss and every gradient equal those of the plain rows
up to float32 summation order (a wrong mask or position is off by O(1)), on one rank,
under TP2 with sequence parallelism (padded packed rows) and under PP2 (the CPU's own
pipeline loop).
"""

from __future__ import annotations

import pytest
import torch

from backends.megatron import ResponseBatch
from backends.megatron.shared_prompt import pack_shared_prompts, prompt_groups
from tests.megatron import shared_prompt_cases as cases
from tests.megatron.cases import SAME_DEVICE_TOL
from tests.support.spawn import run_ranks

TOL = SAME_DEVICE_TOL


def test_rows_are_grouped_by_identical_prompt_in_order_of_first_appearance():
    batch = cases.grpo_like_batch(vocab=96)
    assert prompt_groups(batch) == [[0, 2, 5], [1, 4], [3]]


def test_a_packed_row_holds_the_prompt_once_then_each_response_at_its_own_positions():
    batch = cases.grpo_like_batch(vocab=96)
    packed = pack_shared_prompts(batch)
    ids = batch.input_ids
    # Prompt A (5 tokens) then responses of 4, 2 and 3 tokens.
    assert packed.input_ids[0, :14].tolist() == (
        ids[0, :9].tolist() + ids[2, 5:7].tolist() + ids[5, 5:8].tolist()
    )
    assert packed.position_ids[0, :14].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 5, 6, 5, 6, 7]
    assert packed.members == 3 and packed.member_slots.tolist() == [0, 3, 1, 6, 4, 2]


def test_a_response_sees_the_prompt_and_its_own_earlier_tokens_only():
    packed = pack_shared_prompts(cases.grpo_like_batch(vocab=96))
    visible = ~packed.attention_mask[0, 0]
    second_response_first_token = 9  # after prompt (5) and the first response (4)
    assert visible[second_response_first_token].nonzero().flatten().tolist() == [0, 1, 2, 3, 4, 9]
    assert visible[10].nonzero().flatten().tolist() == [0, 1, 2, 3, 4, 9, 10]


def test_each_response_token_is_scored_by_the_output_before_it_in_the_packed_row():
    batch = cases.grpo_like_batch(vocab=96)
    packed = pack_shared_prompts(batch)
    _, tokens = batch.response_window()
    scored_by = packed.unpack(packed.logit_positions.unsqueeze(-1)).squeeze(-1)  # [B, W]
    for row in range(len(batch)):
        n = int(batch.response_len[row])
        p = int(packed.member_slots[row]) // packed.members
        # The output at a position predicts the packed row's next token of that response:
        # the first token follows the prompt's last token, the others their predecessor.
        assert packed.position_ids[p, scored_by[row, :n]].add(1).tolist() == list(
            range(int(batch.response_start[row]), int(batch.response_start[row]) + n)
        )
        assert (
            tokens[row, :n].tolist()
            == batch.input_ids[row, batch.response_start[row] :][:n].tolist()
        )


def test_a_batch_without_a_repeated_prompt_is_left_as_rows():
    batch = cases.grpo_like_batch(vocab=96)
    distinct = batch.rows(slice(3, 5))  # prompts C and B
    assert pack_shared_prompts(distinct) is None
    assert pack_shared_prompts(ResponseBatch.continuation(torch.tensor([[1, 2, 3]]))) is None


@pytest.fixture(scope="module")
def one_rank():
    (result,) = run_ranks(cases.packed_and_plain, 1)
    return result


@pytest.fixture(scope="module")
def two_ranks():
    return run_ranks(cases.packed_and_plain, 2)


def assert_same(packed: dict, plain: dict) -> None:
    assert packed["shares"] and not plain["shares"]
    for key, value in plain["scored"].items():
        torch.testing.assert_close(packed["scored"][key], value, **TOL)
    assert packed["loss"] == pytest.approx(plain["loss"], rel=1e-5)
    assert packed["grads"].keys() == plain["grads"].keys()
    for name, grad in plain["grads"].items():
        torch.testing.assert_close(packed["grads"][name], grad, **TOL, msg=name)


@pytest.mark.parametrize("head", ["policy", "critic"])
def test_packed_rows_score_and_train_like_plain_rows_on_one_rank(one_rank, head):
    assert_same(one_rank["one", head, True], one_rank["one", head, False])


def test_a_packed_row_shorter_than_its_members_score_columns_trains_like_plain_rows(one_rank):
    assert_same(one_rank["short", "policy", True], one_rank["short", "policy", False])


@pytest.mark.parametrize("layout", ["tp2", "pp2"])
@pytest.mark.parametrize("head", ["policy", "critic"])
def test_packed_rows_score_and_train_like_plain_rows_under_tp_and_pp(two_ranks, layout, head):
    for rank in range(2):
        assert_same(two_ranks[rank][layout, head, True], two_ranks[rank][layout, head, False])


def test_a_step_reports_the_positions_it_computed_and_the_real_tokens_among_them(one_rank):
    # Prompt A (5) x responses 4, 2, 3; B (3) x 1, 4; C (4) x 2: 28 tokens with each
    # prompt once, in three packed rows padded to the longest group (14).
    assert one_rank["one", "policy", True]["tokens"] == (3 * 14, 28)
    # Plain rows: 41 tokens in six rows padded to the longest row (9).
    assert one_rank["one", "policy", False]["tokens"] == (6 * 9, 41)
