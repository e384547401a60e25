"""float64 oracles of a multi-turn trajectory's loss mask (docs/architecture.md §12): its
observation tokens count in no loss, no advantage and no metric.

A trajectory row holds model turns and observations; its mask is 0 on the observations.
The *compact* row keeps the model's tokens only (the observations cut out, the row then
right-padded): every trainer's maths on the masked row must equal its maths on the
compact one, and the gradient reaching an observation token's log-prob is exactly 0.
"""

from __future__ import annotations

import pytest
import torch

from mindrl.workers.sequences import last_counted, loss_mask
from trainers.core import AGG_MODES
from trainers.ppo import compute_gae
from trainers.registry import ALGORITHMS, get_algorithm

#: Rows of (model tokens, observation tokens, model tokens, ...) lengths.
TURNS = [(3, 2, 2), (1, 4, 3, 1, 2), (5,), (2, 1, 1)]
ONLINE = sorted(name for name, cls in ALGORITHMS.items() if not cls.offline)


def trajectory_mask() -> torch.Tensor:
    """``[B, R]`` float64: 1 on model turns (even segments), 0 on observations, 0 past the end."""
    width = max(sum(row) for row in TURNS)
    mask = torch.zeros(len(TURNS), width, dtype=torch.float64)
    for i, row in enumerate(TURNS):
        column = 0
        for k, length in enumerate(row):
            mask[i, column : column + length] = 1.0 if k % 2 == 0 else 0.0
            column += length
    return mask


def compact(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The model tokens' values of each row, left-aligned, and their mask."""
    width = int(mask.sum(1).max())
    out = torch.zeros(values.shape[0], width, dtype=values.dtype)
    kept = torch.zeros(values.shape[0], width, dtype=mask.dtype)
    for i in range(values.shape[0]):
        picked = values[i][mask[i] > 0]
        out[i, : len(picked)], kept[i, : len(picked)] = picked, 1.0
    return out, kept


def batch_of(mask: torch.Tensor, seed: int) -> dict[str, torch.Tensor]:
    """Per-token inputs of every loss, with wild values on the masked-out tokens."""
    gen = torch.Generator().manual_seed(seed)
    shape = mask.shape
    batch = {
        "advantages": torch.randn(shape, generator=gen, dtype=torch.float64),
        "old_logprob": -torch.rand(shape, generator=gen, dtype=torch.float64) * 3,
        "ref_logprob": -torch.rand(shape, generator=gen, dtype=torch.float64) * 3,
        "behaviour_logprob": -torch.rand(shape, generator=gen, dtype=torch.float64) * 3,
    }
    for name, value in batch.items():  # what an observation holds must never matter
        batch[name] = torch.where(
            mask > 0, value, torch.full_like(value, 1e6 if "adv" in name else -50.0)
        )
    return batch


def test_the_dock_mask_of_a_trajectory_is_its_model_tokens_within_the_response():
    mask = trajectory_mask()
    lengths = torch.tensor([sum(row) for row in TURNS])
    padded = torch.cat([mask, torch.ones(len(TURNS), 2, dtype=torch.float64)], dim=1)
    assert torch.equal(
        loss_mask(lengths, mask.shape[1] + 2, padded)[:, : mask.shape[1]], mask.float()
    )
    # The sequence reward lands on the last model token, which ends every trajectory.
    assert last_counted(mask).tolist() == [sum(row) - 1 for row in TURNS]


def test_gae_over_a_masked_trajectory_equals_gae_over_the_model_tokens_alone():
    mask = trajectory_mask()
    gen = torch.Generator().manual_seed(3)
    values = torch.randn(mask.shape, generator=gen, dtype=torch.float64)
    rewards = torch.zeros_like(values)
    rewards[torch.arange(len(TURNS)), last_counted(mask)] = torch.tensor(
        [1.0, 0.5, 0.0, 2.0], dtype=torch.float64
    )
    rewards += 0.1 * torch.randn(mask.shape, generator=gen, dtype=torch.float64) * mask
    for gamma, lam in ((1.0, 0.95), (0.9, 1.0), (0.99, 0.5)):
        advantages, returns = compute_gae(rewards, values, mask, gamma, lam)
        compact_values, compact_mask = compact(values, mask)
        compact_rewards, _ = compact(rewards, mask)
        expected_adv, expected_ret = compute_gae(
            compact_rewards, compact_values, compact_mask, gamma, lam
        )
        assert torch.allclose(compact(advantages, mask)[0], expected_adv, rtol=0, atol=1e-12)
        assert torch.allclose(compact(returns, mask)[0], expected_ret, rtol=0, atol=1e-12)
        assert torch.all(advantages[mask == 0] == 0) and torch.all(returns[mask == 0] == 0)


@pytest.mark.parametrize("trainer", ONLINE)
def test_every_online_trainers_advantages_ignore_the_observations(trainer):
    algorithm = get_algorithm(trainer)
    options = algorithm.resolve(None)
    mask = trajectory_mask()
    gen = torch.Generator().manual_seed(5)
    rewards = torch.zeros_like(mask)
    rewards[torch.arange(len(TURNS)), last_counted(mask)] = torch.tensor(
        [1.0, 0.0, 1.0, 0.5], dtype=torch.float64
    )
    values = torch.randn(mask.shape, generator=gen, dtype=torch.float64)
    masked = {
        "token_rewards": rewards,
        "response_mask": mask,
        "group_ids": torch.tensor([0, 0, 1, 1]),
        "values": values,
    }
    c_rewards, c_mask = compact(rewards, mask)
    compacted = {
        "token_rewards": c_rewards,
        "response_mask": c_mask,
        "group_ids": torch.tensor([0, 0, 1, 1]),
        "values": compact(values, mask)[0],
    }
    got = algorithm.compute_advantages(masked, options)["advantages"]
    want = algorithm.compute_advantages(compacted, options)["advantages"]
    assert torch.allclose(compact(got, mask)[0], want, rtol=0, atol=1e-12)
    assert torch.all(got[mask == 0] == 0)


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("trainer", ONLINE)
def test_an_observation_tokens_gradient_is_exactly_zero_and_the_loss_is_the_model_tokens(
    trainer, mode
):
    algorithm = get_algorithm(trainer)
    if trainer == "gspo" and mode != "seq-mean-token-mean":
        pytest.skip("gspo aggregates one sequence ratio per response only")
    # A run divides sum-norm by a constant (rollout.max_response_length), not the width.
    norm = {"norm_len": 16} if mode == "seq-mean-token-sum-norm" else {}
    options = algorithm.resolve(
        {"loss_agg_mode": mode, "kl_coef": 0.1, "entropy_coef": 0.01, **norm}
    )
    mask = trajectory_mask()
    batch = batch_of(mask, seed=11)
    gen = torch.Generator().manual_seed(12)
    logprob = (-torch.rand(mask.shape, generator=gen, dtype=torch.float64) * 3).requires_grad_()
    entropy = torch.rand(mask.shape, generator=gen, dtype=torch.float64).requires_grad_()
    counts = {"num_tokens": float(mask.sum()), "num_seqs": len(TURNS)}
    loss, _ = algorithm.actor_loss(
        logprob, {**batch, "response_mask": mask}, options, entropy=entropy, **counts
    )
    loss.backward()
    unmasked = mask == 0  # observations (and the padding past each row)
    assert torch.all(logprob.grad[unmasked] == 0.0) and torch.all(entropy.grad[unmasked] == 0.0)
    # The model's tokens do learn (a token the clip holds gets no gradient either).
    assert (logprob.grad[mask > 0] != 0.0).float().mean() > 0.5
    c_mask = compact(mask, mask)[1]
    c_batch = {name: compact(value, mask)[0] for name, value in batch.items()}
    c_loss, _ = algorithm.actor_loss(
        compact(logprob.detach(), mask)[0], {**c_batch, "response_mask": c_mask}, options,
        entropy=compact(entropy.detach(), mask)[0], **counts,
    )  # fmt: skip
    assert loss.item() == pytest.approx(c_loss.item(), rel=1e-12, abs=1e-15)


def test_the_critics_gradient_on_an_observation_is_exactly_zero():
    algorithm = get_algorithm("ppo")
    options = algorithm.resolve(None)
    mask = trajectory_mask()
    gen = torch.Generator().manual_seed(4)
    values = torch.randn(mask.shape, generator=gen, dtype=torch.float64).requires_grad_()
    batch = {
        "old_values": torch.where(mask > 0, values.detach() + 0.05, 1e6),
        "returns": torch.where(
            mask > 0, torch.randn(mask.shape, generator=gen, dtype=torch.float64), -1e6
        ),
        "response_mask": mask,
    }
    loss, _ = algorithm.critic_loss(
        values, batch, options, num_tokens=float(mask.sum()), num_seqs=len(TURNS)
    )
    loss.backward()
    assert torch.all(values.grad[mask == 0] == 0.0) and torch.all(values.grad[mask > 0] != 0.0)
