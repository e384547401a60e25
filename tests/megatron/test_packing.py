"""A micro-batch packed into one row of documents (backends/megatron/packing.py) scores
and trains exactly like its plain right-padded rows, in float64.

Each row its own document, or rows that share a prompt one document (the prompt once):
log-probs, entropies, values, loss and every gradient equal the plain rows' up to
float64 summation order (a wrong mask or position is off by O(1)), on one rank, under TP2
with sequence parallelism (the packed row padded at its tail) and under PP2 (the CPU's
own pipeline loop), for a dense model and, at TP2, MoE and DeepSeek-V3 (MLA, YaRN rotary
per layer). The positions computed per step are the real tokens, plus the tail pad.
"""

from __future__ import annotations

import pytest
import torch

from backends.megatron.packing import pack_micro_batch, prompt_groups
from tests.megatron import packing_cases as cases
from tests.support.spawn import run_ranks

EXACT = {"rtol": 1e-9, "atol": 1e-12}
#: Megatron's router computes its probabilities in float32 (topk_softmax_with_capacity;
#: DeepSeek's also its logits, moe_router_dtype fp32): packing changes which tokens share
#: those sums, so an MoE model's grads agree to float32's precision, not float64's.
ROUTED = {"rtol": 1e-6, "atol": 1e-8}


def test_rows_are_grouped_by_identical_prompt_in_order_of_first_appearance():
    batch = cases.grpo_like_batch(vocab=96)
    assert prompt_groups(batch) == [[0, 2, 5], [1, 4], [3]]


def test_a_packed_row_holds_each_prompt_once_then_its_responses_with_no_padding_between():
    batch = cases.grpo_like_batch(vocab=96)
    packed = pack_micro_batch(batch, share_prompts=True)
    ids = batch.input_ids
    # Prompt A (5 tokens) and responses of 4, 2, 3; B (3) and 1, 4; C (4) and 2.
    assert packed.input_ids[0].tolist() == (
        ids[0, :9].tolist() + ids[2, 5:7].tolist() + ids[5, 5:8].tolist()
        + ids[1, :4].tolist() + ids[4, 3:7].tolist() + ids[3, :6].tolist()
    )  # fmt: skip
    assert packed.position_ids[0].tolist() == (
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 5, 6, 5, 6, 7, 0, 1, 2, 3, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5]
    )
    assert packed.real_tokens == packed.input_ids.shape[1] == 28
    assert packed.mask.document[0].tolist() == [0] * 14 + [1] * 8 + [2] * 6
    assert packed.mask.member[0].tolist() == (
        [0] * 5 + [1] * 4 + [2] * 2 + [3] * 3 + [0] * 3 + [1] + [2] * 4 + [0] * 6
    )


def test_without_sharing_each_row_is_a_document_and_only_the_tail_is_padded():
    batch = cases.grpo_like_batch(vocab=96)
    lengths = (batch.response_start + batch.response_len).tolist()
    packed = pack_micro_batch(batch, share_prompts=False, multiple=4)
    rows = [t for row, n in enumerate(lengths) for t in batch.input_ids[row, :n].tolist()]
    assert packed.real_tokens == sum(lengths) == len(rows) == 41
    assert packed.input_ids[0].tolist() == [*rows, 0, 0, 0]  # 44: a multiple of 4
    document = packed.mask.document[0].tolist()
    assert document == [d for d, n in enumerate(lengths) for _ in range(n)] + [6] * 3
    assert not packed.mask.member.any()  # every document plain causal


def test_a_response_sees_its_prompt_and_its_own_earlier_tokens_only():
    packed = pack_micro_batch(cases.grpo_like_batch(vocab=96), share_prompts=True)
    visible = packed.mask.visible()[0]
    second_response_first_token = 9  # after prompt A (5) and the first response (4)
    assert visible[second_response_first_token].nonzero().flatten().tolist() == [0, 1, 2, 3, 4, 9]
    assert visible[10].nonzero().flatten().tolist() == [0, 1, 2, 3, 4, 9, 10]
    assert visible[14].nonzero().flatten().tolist() == [14]  # prompt B sees no A token


@pytest.mark.parametrize("share", [True, False])
def test_each_response_token_is_scored_by_the_output_of_the_token_before_it(share):
    batch = cases.grpo_like_batch(vocab=96)
    packed = pack_micro_batch(batch, share_prompts=share, multiple=2)
    scored_by = packed.unpack(packed.logit_positions.unsqueeze(-1)).squeeze(-1)  # [B, W]
    for row in range(len(batch)):
        start, n = int(batch.response_start[row]), int(batch.response_len[row])
        before = batch.input_ids[row, start - 1 : start + n - 1]  # the unpacked row's
        assert packed.input_ids[0, scored_by[row, :n]].tolist() == before.tolist()
        positions = packed.position_ids[0, scored_by[row, :n]].add(1).tolist()
        assert positions == list(range(start, start + n))


@pytest.fixture(scope="module")
def one_rank():
    (result,) = run_ranks(cases.packed_and_plain, 1)
    return result


@pytest.fixture(scope="module")
def two_ranks():
    return run_ranks(cases.packed_and_plain, 2)


def assert_same(packed: dict, plain: dict, grads_tol: dict = EXACT) -> None:
    assert plain["layout"] == (False, False)
    for key, value in plain["scored"].items():
        assert value.dtype == torch.float64
        torch.testing.assert_close(packed["scored"][key], value, **EXACT)
    assert packed["loss"] == pytest.approx(plain["loss"], rel=1e-12)
    assert packed["grads"].keys() == plain["grads"].keys()
    for name, grad in plain["grads"].items():
        torch.testing.assert_close(packed["grads"][name], grad, **grads_tol, msg=name)


@pytest.mark.parametrize("mode", ["packed", "shared"])
@pytest.mark.parametrize("head", ["policy", "critic"])
def test_packed_rows_score_and_train_like_plain_rows_on_one_rank(one_rank, head, mode):
    runs = one_rank["one", head]
    assert runs[mode]["layout"] == cases.MODES[mode]
    assert_same(runs[mode], runs["rows"])


@pytest.mark.parametrize("mode", ["packed", "shared"])
def test_a_packed_row_shorter_than_its_members_score_columns_trains_like_plain_rows(one_rank, mode):
    assert_same(one_rank["short"][mode], one_rank["short"]["rows"])


@pytest.mark.parametrize("mode", ["packed", "shared"])
@pytest.mark.parametrize("layout", ["tp2", "pp2"])
@pytest.mark.parametrize("head", ["policy", "critic"])
def test_packed_rows_score_and_train_like_plain_rows_under_tp_and_pp(two_ranks, layout, head, mode):
    for rank in range(2):
        runs = two_ranks[rank][layout, head]
        assert_same(runs[mode], runs["rows"])


@pytest.mark.parametrize("mode", ["packed", "shared"])
@pytest.mark.parametrize("family", ["moe", "deepseek"])
def test_moe_and_mla_models_pack_like_plain_rows_at_tp2(two_ranks, family, mode):
    for rank in range(2):
        assert_same(two_ranks[rank][family][mode], two_ranks[rank][family]["rows"], ROUTED)


def test_a_step_computes_the_real_tokens_plus_only_the_tail_pad(one_rank, two_ranks):
    # 41 tokens in six rows (longest 9); 28 with each prompt once.
    assert {mode: run["tokens"] for mode, run in one_rank["one", "policy"].items()} == {
        "rows": (6 * 9, 41),
        "packed": (41, 41),
        "shared": (28, 28),
    }
    # TP2: plain rows padded to 10, the packed row's tail to 42.
    assert {mode: run["tokens"] for mode, run in two_ranks[0]["tp2", "policy"].items()} == {
        "rows": (6 * 10, 41),
        "packed": (42, 41),
        "shared": (28, 28),
    }
