"""PPO (Schulman et al. 2017) with a critic and GAE.

GAE runs backwards over each response, only across valid (masked-in) tokens:
``delta_t = r_t + gamma * V_next - V_t`` and ``A_t = delta_t + gamma * lam * A_next``,
where ``V_next`` / ``A_next`` are those of the next *valid* token (0 after the last),
so padding anywhere in the response is skipped. ``returns = A + V`` (before
whitening); advantages are whitened over the masked tokens of the batch.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from trainers.base import Algorithm, AlgorithmOptions
from trainers.core import masked_whiten


def compute_gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Whitened advantages and returns, both ``[batch, T]`` and zero on padding."""
    mask = mask.to(values.dtype)
    batch, length = values.shape
    advantages = torch.zeros_like(values)
    next_value = torch.zeros(batch, dtype=values.dtype)
    next_advantage = torch.zeros(batch, dtype=values.dtype)
    for t in reversed(range(length)):
        valid = mask[:, t]
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        current = delta + gamma * lam * next_advantage
        advantages[:, t] = current * valid
        # Padding passes the next valid token's value and advantage through unchanged.
        next_value = torch.where(valid > 0, values[:, t], next_value)
        next_advantage = torch.where(valid > 0, current, next_advantage)
    returns = (advantages + values) * mask
    return masked_whiten(advantages, mask), returns


class PPO(Algorithm):
    name = "ppo"
    needs_critic = True
    defaults: ClassVar[dict[str, object]] = {
        "kl_coef": 0.001,
        "clip_high": 0.2,
        "loss_agg_mode": "token-mean",
        "dynamic_sampling": False,
    }

    def compute_advantages(
        self, batch: dict[str, torch.Tensor], options: AlgorithmOptions
    ) -> dict[str, torch.Tensor]:
        advantages, returns = compute_gae(
            batch["token_rewards"],
            batch["values"],
            batch["response_mask"],
            options.gamma,
            options.lam,
        )
        return {"advantages": advantages, "returns": returns}
