"""DAPO (Yu et al. 2025): GRPO with decoupled clip, dynamic sampling, overlong shaping.

Defaults: ``clip_low`` 0.2 and ``clip_high`` 0.28 ("clip-higher"), no KL, token-mean
loss, dynamic sampling on (groups whose rewards are all equal carry no gradient and are
dropped; the pipeline keeps drawing prompt batches until the batch is full or
``max_sample_batches`` is reached, 0 = no limit) and an optional soft overlong penalty
``min(-(len - (L_max - buffer)) / buffer * factor, 0)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch

from trainers.base import Algorithm, AlgorithmOptions
from trainers.grpo import compute_advantages as grpo_advantages


def filter_groups(rewards: torch.Tensor, group_ids: torch.Tensor | Sequence) -> torch.Tensor:
    """Boolean keep-mask per sample: True where the sample's group has differing rewards."""
    ids = torch.as_tensor(group_ids) if not isinstance(group_ids, torch.Tensor) else group_ids
    keep = torch.zeros(len(ids), dtype=torch.bool)
    for group in torch.unique(ids):
        members = ids == group
        group_rewards = rewards[members]
        keep[members] = bool((group_rewards != group_rewards[0]).any())
    return keep


def overlong_penalty(
    lengths: torch.Tensor, max_len: int, buffer: int, factor: float
) -> torch.Tensor:
    """Soft penalty for responses within ``buffer`` tokens of ``max_len`` (0 if buffer=0)."""
    lengths = torch.as_tensor(lengths, dtype=torch.float64)
    if buffer <= 0:
        return torch.zeros_like(lengths)
    excess = lengths - (max_len - buffer)
    return torch.clamp(-excess / buffer * factor, max=0.0)


class DAPO(Algorithm):
    name = "dapo"
    uses_groups = True
    defaults: ClassVar[dict[str, object]] = {
        "kl_coef": 0.0,
        "clip_high": 0.28,
        "loss_agg_mode": "token-mean",
        "dynamic_sampling": True,
    }

    def compute_advantages(
        self, batch: dict[str, torch.Tensor], options: AlgorithmOptions
    ) -> dict[str, torch.Tensor]:
        advantages = grpo_advantages(
            batch["token_rewards"],
            batch["response_mask"],
            batch["group_ids"],
            norm_by_std=options.norm_adv_by_std,
        )
        return {"advantages": advantages}
