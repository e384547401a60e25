"""GRPO (Shao et al. 2024): group-relative advantages, no critic.

Each prompt's N responses form a group. A response's score is the sum of its token
rewards; its advantage is ``(s_i - mean_g) / (std_g + eps)`` over its group (unbiased
std), broadcast over its response tokens. A group of one has mean 0 and std 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch

from trainers.base import Algorithm, AlgorithmOptions


def compute_advantages(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    group_ids: torch.Tensor | Sequence,
    eps: float = 1e-6,
    norm_by_std: bool = True,
) -> torch.Tensor:
    """Group-normalised advantages ``[batch, T]`` (groups by id, not by position)."""
    scores = (token_rewards * mask).sum(-1)
    ids = torch.as_tensor(group_ids) if not isinstance(group_ids, torch.Tensor) else group_ids
    _, inverse = torch.unique(ids, return_inverse=True)
    normalized = torch.empty_like(scores)
    for group in range(int(inverse.max()) + 1 if len(inverse) else 0):
        members = inverse == group
        group_scores = scores[members]
        if group_scores.numel() == 1:
            mean, std = torch.zeros_like(group_scores[0]), torch.ones_like(group_scores[0])
        else:
            mean, std = group_scores.mean(), group_scores.std(unbiased=True)
        centered = group_scores - mean
        normalized[members] = centered / (std + eps) if norm_by_std else centered
    return normalized.unsqueeze(-1) * mask


class GRPO(Algorithm):
    name = "grpo"
    uses_groups = True
    defaults: ClassVar[dict[str, object]] = {
        "kl_coef": 0.001,
        "clip_high": 0.2,
        "loss_agg_mode": "token-mean",
        "dynamic_sampling": False,
    }

    def compute_advantages(
        self, batch: dict[str, torch.Tensor], options: AlgorithmOptions
    ) -> dict[str, torch.Tensor]:
        advantages = compute_advantages(
            batch["token_rewards"],
            batch["response_mask"],
            batch["group_ids"],
            norm_by_std=options.norm_adv_by_std,
        )
        return {"advantages": advantages}
