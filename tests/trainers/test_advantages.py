"""GRPO group advantages, PPO's GAE and DAPO's filters against float64 loop references."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.trainers import loop_reference as ref
from tests.trainers.batches import random_inputs
from trainers.dapo import add_at_last_token, filter_groups, overlong_penalty
from trainers.grpo import compute_advantages
from trainers.ppo import compute_gae

# Interleaved groups, a group of one (id 9) and a group whose rewards are all equal (id 4).
GROUP_IDS = [7, 3, 7, 3, 9, 7, 4, 3, 4, 7]


def as64(nested: list) -> torch.Tensor:
    return torch.tensor(nested, dtype=torch.float64)


def grpo_inputs(seed: int):
    mask, (rewards,) = random_inputs(seed, count=1)
    rewards[6], rewards[8] = 0.0, 0.0
    rewards[6, 0] = rewards[8, 0] = 1.0  # group 4: equal scores (both rows have token 0)
    mask[6, 0] = mask[8, 0] = 1.0
    return rewards, mask


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_grpo_advantages_match_the_loop_over_groups_by_id(norm_by_std):
    rewards, mask = grpo_inputs(0)
    got, scores = compute_advantages(
        rewards, mask, torch.tensor(GROUP_IDS), norm_by_std=norm_by_std, return_scores=True
    )
    want = ref.grpo(rewards, mask, GROUP_IDS, norm_by_std=norm_by_std)
    torch.testing.assert_close(got, as64(want))
    assert scores[4].item() == pytest.approx(float((rewards[4] * mask[4]).sum()))


def test_grpo_edge_cases_group_of_one_equal_rewards_and_empty_rows():
    rewards, mask = grpo_inputs(1)
    adv, scores = compute_advantages(rewards, mask, GROUP_IDS, return_scores=True)
    singleton = 4
    assert adv[singleton][mask[singleton] > 0].tolist() == pytest.approx(
        [scores[singleton].item() / (1 + 1e-6)] * int(mask[singleton].sum())
    )
    assert adv[6].abs().sum().item() == 0.0 and adv[8].abs().sum().item() == 0.0
    assert adv[3].abs().sum().item() == 0.0  # an all-padding row: zero everywhere
    assert (adv[mask == 0] == 0).all()


def test_grpo_accepts_string_uids_and_float32():
    rewards, mask = grpo_inputs(2)
    uids = [f"prompt-{g}" for g in GROUP_IDS]
    got = compute_advantages(rewards.float(), mask.float(), uids)
    assert got.dtype == torch.float32
    want = as64(ref.grpo(rewards, mask, GROUP_IDS))
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_grpo_refuses_a_group_id_list_of_the_wrong_length():
    with pytest.raises(ValueError, match="group_ids has 2 entries for a batch of 3"):
        compute_advantages(torch.ones(3, 2), torch.ones(3, 2), [0, 1])


@st.composite
def gae_cases(draw):
    batch, length = draw(st.integers(1, 5)), draw(st.integers(1, 9))
    bits = st.lists(st.booleans(), min_size=length, max_size=length)
    mask = torch.tensor(draw(st.lists(bits, min_size=batch, max_size=batch)), dtype=torch.float64)
    seed = draw(st.integers(0, 2**31 - 1))
    gamma, lam = draw(st.floats(0.0, 1.0)), draw(st.floats(0.0, 1.0))
    return mask, seed, gamma, lam


@settings(max_examples=60, deadline=None)
@given(case=gae_cases())
def test_gae_matches_the_loop_reference_for_any_shape_and_padding(case):
    mask, seed, gamma, lam = case
    generator = torch.Generator().manual_seed(seed)
    rewards, values = torch.randn(2, *mask.shape, generator=generator, dtype=torch.float64)
    adv, returns = compute_gae(rewards, values, mask, gamma, lam)
    want_adv, want_returns = ref.gae(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(returns, as64(want_returns))
    torch.testing.assert_close(adv, as64(want_adv))


def test_gae_in_float32_matches_the_float64_reference():
    mask, (rewards, values) = random_inputs(3, count=2)
    adv, returns = compute_gae(rewards.float(), values.float(), mask.float(), 0.99, 0.95)
    want_adv, want_returns = ref.gae(rewards, values, mask, 0.99, 0.95)
    assert adv.dtype == torch.float32
    torch.testing.assert_close(returns.double(), as64(want_returns), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(adv.double(), as64(want_adv), rtol=1e-5, atol=1e-5)


def test_gae_skips_left_padding_and_holes_as_if_the_tokens_were_contiguous():
    rewards = torch.tensor([[9.0, 1.0, 9.0, 0.5, 2.0], [1.0, 0.5, 2.0, 0.0, 0.0]])
    values = torch.tensor([[9.0, 0.3, 9.0, 0.2, 0.1], [0.3, 0.2, 0.1, 0.0, 0.0]])
    mask = torch.tensor([[0.0, 1, 0, 1, 1], [1, 1, 1, 0, 0]])  # the same 3 tokens, spread
    _, returns = compute_gae(rewards, values, mask, 0.9, 0.8)
    torch.testing.assert_close(returns[0][mask[0] > 0], returns[1][mask[1] > 0])


def test_gae_with_gamma_and_lambda_one_returns_the_reward_to_go():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.25, 0.75, 0.0]])
    _, returns = compute_gae(rewards, values, torch.tensor([[1.0, 1, 1, 0]]), 1.0, 1.0)
    assert returns.tolist() == [[1.0, 1.0, 1.0, 0.0]]


def test_filter_groups_keeps_groups_whose_rewards_differ_and_singletons():
    generator = torch.Generator().manual_seed(4)
    rewards = torch.randint(0, 2, (10,), generator=generator).double()
    rewards[[6, 8]] = 1.0
    got = filter_groups(rewards, torch.tensor(GROUP_IDS))
    assert got.tolist() == ref.filter_groups(rewards, GROUP_IDS)
    assert got[4] and not got[6] and not got[8]
    strict = filter_groups(rewards, GROUP_IDS, keep_singletons=False)
    assert strict.tolist() == ref.filter_groups(rewards, GROUP_IDS, keep_singletons=False)
    assert not strict[4]


def test_filter_groups_drops_everything_when_all_rewards_are_equal():
    assert not filter_groups(torch.ones(6), ["a", "a", "b", "b", "c", "c"]).any()


@pytest.mark.parametrize(("max_len", "buffer", "factor"), [(16, 4, 1.0), (20, 8, 0.5), (8, 0, 1.0)])
def test_overlong_penalty_is_zero_until_the_buffer_then_linear(max_len, buffer, factor):
    lengths = torch.arange(0, max_len + 3)
    got = overlong_penalty(lengths, max_len, buffer, factor)
    want = [ref.overlong(float(n), max_len, buffer, factor) for n in lengths.tolist()]
    assert got.tolist() == pytest.approx(want)
    if buffer:
        assert got[max_len].item() == pytest.approx(-factor)


def test_overlong_penalty_refuses_a_buffer_longer_than_the_max_length():
    with pytest.raises(ValueError, match="overlong buffer must be in"):
        overlong_penalty(torch.tensor([3]), max_len=4, buffer=5, factor=1.0)


def test_a_per_sequence_reward_lands_on_the_last_valid_token():
    mask = torch.tensor([[1.0, 1, 0], [0, 1, 0], [0, 0, 0]])
    got = add_at_last_token(torch.zeros(3, 3), mask, torch.tensor([1.0, 2.0, 3.0]))
    assert got.tolist() == [[0.0, 1.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 0.0]]
