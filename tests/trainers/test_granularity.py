"""Embodied RL's levels (trainers/granularity.py): chunk, action and token units, their
masks after a done, the refused pairs, and GAE over chunk steps with a truncated
episode bootstrapping from its final observation."""

from __future__ import annotations

import pytest
import torch

from trainers.core import aggregate_loss
from trainers.granularity import (
    chunk_gae,
    logprobs_at,
    rewards_at,
    spread,
    valid_at,
    width,
)


@pytest.fixture(autouse=True)
def float64_by_default():
    """Exact sums here; the default goes back after each test, since set for the whole
    process it would make every other module's tensors float64."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def random_chunk(n: int, chunk: int, dims: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(chunk * 10 + dims)
    token_logprobs = -torch.rand(n, chunk * dims, generator=generator)
    rewards = torch.randn(n, chunk, generator=generator)
    valid = torch.rand(n, chunk, generator=generator) > 0.3
    return token_logprobs, rewards, valid


def test_a_chunk_of_one_action_is_scored_at_the_chunk_level_exactly_as_at_the_action_level():
    logprobs, rewards, valid = random_chunk(5, chunk=1, dims=3)
    assert torch.equal(logprobs_at(logprobs, "chunk", 3), logprobs_at(logprobs, "action", 3))
    assert torch.equal(rewards_at(rewards, valid, "chunk"), rewards_at(rewards, valid, "action"))
    assert torch.equal(valid_at(valid, "chunk", 3), valid_at(valid, "action", 3))
    advantages = torch.randn(5, 1)
    assert torch.equal(
        spread(advantages, "chunk", "token", 1, 3), spread(advantages, "action", "token", 1, 3)
    )


def test_one_action_dimension_makes_the_token_level_the_action_level():
    logprobs, _, valid = random_chunk(5, chunk=4, dims=1)
    assert torch.equal(logprobs_at(logprobs, "token", 1), logprobs_at(logprobs, "action", 1))
    assert torch.equal(valid_at(valid, "token", 1), valid_at(valid, "action", 1))
    advantages = torch.randn(5, 4)
    assert torch.equal(spread(advantages, "action", "token", 4, 1), advantages)


def test_each_level_sums_the_log_probs_of_its_tokens():
    logprobs = torch.tensor([[-1.0, -2.0, -3.0, -4.0, -5.0, -6.0]])  # C 3 actions of A 2
    assert logprobs_at(logprobs, "action", 2).tolist() == [[-3.0, -7.0, -11.0]]
    assert logprobs_at(logprobs, "chunk", 2).tolist() == [[-21.0]]
    assert [width(level, 3, 2) for level in ("chunk", "action", "token")] == [1, 3, 6]


def test_actions_after_the_first_done_neither_count_nor_dilute_the_loss():
    valid = torch.tensor([[True, True, False], [True, False, False]])  # done at 2nd, 1st
    assert valid_at(valid, "token", 2).tolist() == [
        [True, True, True, True, False, False],
        [True, True, False, False, False, False],
    ]
    assert rewards_at(torch.ones(2, 3), valid, "chunk").tolist() == [[2.0], [1.0]]
    losses = torch.tensor([[1.0, 2.0, 1e6], [3.0, -1e6, 7.0]])  # not applied: any value
    mask = valid_at(valid, "action", 2)
    # each valid action weighs 1 / T with T the batch's 3 valid actions
    assert aggregate_loss(losses, mask, "token-mean", num_tokens=mask.sum()) == pytest.approx(2.0)


def test_advantages_are_spread_onto_finer_units_and_never_onto_coarser_ones():
    per_action = torch.tensor([[1.0, 2.0]])
    assert spread(per_action, "action", "token", 2, 3).tolist() == [[1.0, 1.0, 1.0, 2.0, 2.0, 2.0]]
    assert spread(torch.tensor([[5.0]]), "chunk", "action", 2, 3).tolist() == [[5.0, 5.0]]
    with pytest.raises(ValueError, match="cannot spread action values onto coarser chunk"):
        spread(per_action, "action", "chunk", 2, 3)


def test_gae_bootstraps_a_truncated_episode_from_its_final_observation_and_not_a_terminated_one():
    gamma, lam = 0.9, 0.5
    # one environment, three chunk steps: truncated at step 0 (time limit), a new
    # episode at step 1 that terminates at step 2
    rewards = torch.tensor([[1.0], [0.0], [2.0]])
    values = torch.tensor([[0.5], [0.2], [0.4]])
    next_values = torch.tensor([[0.8], [0.4], [9.0]])  # 0.8: the truncated final obs
    terminated = torch.tensor([[False], [False], [True]])
    ended = torch.tensor([[True], [False], [True]])
    advantages, returns = chunk_gae(rewards, values, next_values, terminated, ended, gamma, lam)
    delta2 = 2.0 - 0.4  # terminated: the 9.0 is never used
    delta1 = 0.0 + gamma * 0.4 - 0.2
    delta0 = 1.0 + gamma * 0.8 - 0.5  # truncated: bootstraps, and its episode ends here
    expected = [delta0, delta1 + gamma * lam * delta2, delta2]
    assert advantages[:, 0].tolist() == pytest.approx(expected)
    assert torch.equal(returns, advantages + values)


def test_gae_with_lambda_one_and_no_ends_is_the_discounted_return_minus_the_value():
    rewards = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    values = torch.tensor([[0.3, 0.1], [0.2, 0.6], [0.4, 0.5]])
    last = torch.tensor([[0.7, 0.9]])  # the value after the last step
    next_values = torch.cat([values[1:], last])
    never = torch.zeros_like(rewards, dtype=torch.bool)
    advantages, _ = chunk_gae(rewards, values, next_values, never, never, 0.9, 1.0)
    discounted = [
        rewards[t:].T @ (0.9 ** torch.arange(3 - t)) + 0.9 ** (3 - t) * last[0] for t in range(3)
    ]
    assert torch.allclose(advantages, torch.stack(discounted) - values, rtol=0, atol=1e-12)
