"""Embodied RL's levels (trainers/granularity.py): chunk, action and token units, their
masks after a done and the refused pairs (PPO's GAE over chunk steps and actions:
tests/trainers/test_embodied_loop.py)."""

from __future__ import annotations

import pytest
import torch

from trainers.core import aggregate_loss
from trainers.granularity import (
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
