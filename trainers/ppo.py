"""PPO (Schulman et al. 2017) with a critic and GAE (Schulman et al. 2016).

GAE runs backwards over each response, across valid (mask=1) tokens only:

    delta_t = r_t + gamma * V_next - V_t
    A_t     = delta_t + gamma * lam * A_next

where ``V_next`` and ``A_next`` belong to the next *valid* token of the same row (0 after
the last one). A masked position is skipped: it carries the next valid token's value
and advantage through unchanged, so padding anywhere (right, left, or holes inside the
response) neither cuts nor shifts the recursion; its reward is ignored (put rewards on
valid tokens) and its advantage and return are 0. ``returns = A + V`` (unwhitened);
the advantages are then whitened over all valid tokens of the batch (unbiased variance).

Why the defaults are what they are: ``lam`` 1 (verl's default; GAE then is
the Monte-Carlo return minus the value) and an entropy bonus of 0.05, with batch
whitening. With the textbook ``lam`` 0.95 and no bonus PPO ended near 0.75 on
``configs/tiny.yaml`` (seed 1234): its policy turned deterministic (entropy below 0.3
by iteration ~85) while 20-30 % of the prompts were still answered wrongly, and then
nothing right was sampled for them. That timing is the recipe's (actor lr 1e-3, one
Adam step per iteration), not PPO's: every online trainer measured on it crosses
entropy 0.3 between iterations 59 and 115, GRPO included, whose 1.0 at seed 1234 is
0.50 at seed 7. ``lam`` 1 alone gave 0.91 at seed 1234 but 0.65 at seed 7, a 5x faster
critic 0.79 at seed 7 with an unstable value; the bonus delays the collapse, and with
``lam`` 1 it reached >= 0.9 at seeds 1234, 42 and 7 (last 10: 0.997, 0.95, 0.86;
docs/guide/algorithms.md). The base default stays ``entropy_coef`` 0 for the other
trainers, each measured without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from mindrl.config.schema import AlgorithmConfig
from trainers.core import Number, PolicyGradientAlgorithm, masked_whiten, value_loss
from trainers.granularity import rewards_at, valid_at


@torch.no_grad()
def compute_gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
    whiten: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (formulas in the module docstring).

    Args:
        token_rewards: ``[batch, T]`` per-token rewards.
        values: ``[batch, T]`` critic values of the old policy (no gradient flows).
        mask: ``[batch, T]`` 1 on response tokens.
        gamma: discount.
        lam: GAE lambda.
        whiten: whiten the advantages over the valid tokens (else left as estimated).

    Returns:
        ``(advantages, returns)``, both ``[batch, T]`` and 0 on padding: advantages
        whitened over the valid tokens, returns = unwhitened advantages + values.
    """
    valid = mask.bool()
    advantages = torch.zeros_like(values)
    next_value = values.new_zeros(values.shape[0])
    next_advantage = values.new_zeros(values.shape[0])
    for t in reversed(range(values.shape[-1])):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        current = delta + gamma * lam * next_advantage
        advantages[:, t] = torch.where(valid[:, t], current, 0.0)
        # A padded position passes the next valid token's value and advantage through.
        next_value = torch.where(valid[:, t], values[:, t], next_value)
        next_advantage = torch.where(valid[:, t], current, next_advantage)
    returns = torch.where(valid, advantages + values, 0.0)
    return (masked_whiten(advantages, mask) if whiten else advantages), returns


class PPO(PolicyGradientAlgorithm):
    """PPO with a learned value model, GAE advantages and a KL penalty in the loss."""

    name = "ppo"
    needs_critic = True
    needs_reference = True
    chunk_value_head = True
    # lam 1 and an entropy bonus of 0.05: why, in the module docstring.
    defaults: ClassVar[dict[str, object]] = {"kl_coef": 0.001, "lam": 1.0, "entropy_coef": 0.05}

    def compute_advantages(
        self, batch: Mapping[str, torch.Tensor], options: AlgorithmConfig
    ) -> dict[str, torch.Tensor]:
        """``advantages`` and ``returns`` from ``token_rewards``, ``values``, ``response_mask``."""
        advantages, returns = compute_gae(
            batch["token_rewards"],
            batch["values"],
            batch["response_mask"],
            options.gamma,
            options.lam,
        )
        return {"advantages": advantages, "returns": returns}

    def chunk_step_advantages(
        self,
        rewards: torch.Tensor,
        values: torch.Tensor,
        valid: torch.Tensor,
        bootstrap: torch.Tensor,
        options: AlgorithmConfig,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """GAE over each episode's units of ``options.reward_level`` in time order: its
        chunk steps (a step's reward the sum of its applied actions') or every action of
        every chunk (each its own reward and value, gamma per action; RLinf-VLA's
        action level). An episode cut off by its horizon is not an ending, so the
        discounted ``bootstrap`` value of where it stopped is added to its last valid
        unit's reward (a terminated one's is 0); the next value after it is 0 either
        way. Whitened over the given episodes' valid units unless ``norm_adv_by_std`` is
        off: scaled to unit spread, the small advantages of a policy that already
        succeeds become as large as a failing one's (the cloned start's case,
        docs/guide/environments.md). Shapes: ``rewards`` / ``valid`` ``[episodes, T,
        C]``, ``values`` and both results ``[episodes, T, width(reward_level)]``."""
        level = options.reward_level
        units = rewards_at(rewards, valid.bool(), level).to(values)
        mask = valid_at(valid.bool(), level, action_dims=1)
        episodes, steps, per_step = values.shape
        flat_rewards, flat_mask = units.reshape(episodes, -1), mask.reshape(episodes, -1)
        last = torch.where(flat_mask, torch.arange(steps * per_step), -1).amax(dim=1)
        rows = torch.nonzero(last >= 0).squeeze(-1)
        flat_rewards[rows, last[rows]] += options.gamma * bootstrap[rows].to(flat_rewards)
        flat_values, whiten = values.reshape(episodes, -1), bool(options.norm_adv_by_std)
        advantages, returns = compute_gae(
            flat_rewards, flat_values, flat_mask, options.gamma, options.lam, whiten
        )
        return advantages.view_as(values), returns.view_as(values)

    def critic_loss(
        self,
        values: torch.Tensor,
        batch: Mapping[str, torch.Tensor],
        options: AlgorithmConfig,
        num_tokens: Number | None = None,
        num_seqs: Number | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Clipped value loss of ``values`` ``[batch, T]`` against the batch's ``returns``,
        around its ``old_values``; ``num_tokens`` / ``num_seqs`` as in aggregate_loss."""
        return value_loss(
            values,
            batch["old_values"],
            batch["returns"],
            batch["response_mask"],
            options.value_clip,
            options.loss_agg_mode,
            num_tokens,
            num_seqs=num_seqs,
        )
