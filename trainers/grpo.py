"""GRPO (Shao et al. 2024): group-relative advantages, no critic.

Each prompt's N responses form a group, found by id (a prompt uid), not by position:
groups may be interleaved. Response ``i`` scores ``s_i = sum_t r_it * mask_it``; its
advantage is ``A_i = (s_i - mean_g) / (std_g + eps)`` with the unbiased std of its
group (``s_i - mean_g`` when ``norm_by_std`` is off, Dr. GRPO), broadcast over its
response tokens and zero on padding. A group of one has mean 0 and std 1 (its advantage
is its own score); a group whose scores are all equal gets advantage 0.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import ClassVar

import torch

from mindrl.config.schema import AlgorithmConfig
from trainers.core import PolicyGradientAlgorithm, masked_sum

GroupIds = torch.Tensor | Sequence[Hashable]


def group_index(group_ids: GroupIds, batch: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """Dense group number ``[batch]`` (0..G-1) per sample, and G, for any hashable ids.

    Raises:
        ValueError: there is not exactly one id per sample.
    """
    if len(group_ids) != batch:
        raise ValueError(f"group_ids has {len(group_ids)} entries for a batch of {batch}")
    if isinstance(group_ids, torch.Tensor):
        unique, inverse = torch.unique(group_ids, return_inverse=True)
        return inverse.to(device), unique.numel()
    numbers: dict[Hashable, int] = {}
    dense = [numbers.setdefault(group_id, len(numbers)) for group_id in group_ids]
    return torch.tensor(dense, dtype=torch.long, device=device), len(numbers)


def group_mean_std(
    scores: torch.Tensor, index: torch.Tensor, n_groups: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample mean and unbiased std ``[batch]`` of each sample's group (1 -> 0, 1)."""
    zeros = scores.new_zeros(n_groups)
    count = zeros.index_add(0, index, torch.ones_like(scores))
    mean = zeros.index_add(0, index, scores) / count
    # Two passes (mean, then squared deviations) stay accurate in float32.
    centered = scores - mean[index]
    var = zeros.index_add(0, index, centered.square()) / (count - 1).clamp(min=1)
    singleton = count[index] == 1
    sample_mean = torch.where(singleton, 0.0, mean[index])
    sample_std = torch.where(singleton, 1.0, var.sqrt()[index])
    return sample_mean, sample_std


def compute_advantages(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    group_ids: GroupIds,
    eps: float = 1e-6,
    norm_by_std: bool = True,
    return_scores: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Group-normalised advantages (formula in the module docstring).

    Args:
        token_rewards: ``[batch, T]`` rewards (usually one non-zero, at the last token).
        mask: ``[batch, T]`` 1 on response tokens.
        group_ids: ``[batch]`` ids (tensor, or a list of any hashable, e.g. uid strings).
        eps: added to the std.
        norm_by_std: divide by the group std (off: only subtract the group mean).
        return_scores: also return the sequence scores ``[batch]``.

    Returns:
        Advantages ``[batch, T]``, zero on padding (and the scores if asked).
    """
    scores = masked_sum(token_rewards, mask, dim=-1)
    index, n_groups = group_index(group_ids, scores.shape[0], scores.device)
    mean, std = group_mean_std(scores, index, n_groups)
    per_sample = (scores - mean) / (std + eps) if norm_by_std else scores - mean
    advantages = torch.where(mask.bool(), per_sample.unsqueeze(-1), 0.0)
    return (advantages, scores) if return_scores else advantages


class GRPO(PolicyGradientAlgorithm):
    """Group-relative policy optimisation: no critic, KL to the reference in the loss."""

    name = "grpo"
    uses_groups = True
    group_local_advantages = True  # mean and std within each group
    needs_reference = True
    defaults: ClassVar[dict[str, object]] = {"kl_coef": 0.001}

    def compute_advantages(
        self, batch: Mapping[str, torch.Tensor], options: AlgorithmConfig
    ) -> dict[str, torch.Tensor]:
        """``advantages``, ``scores`` from ``token_rewards``, ``response_mask``, ``group_ids``."""
        advantages, scores = compute_advantages(
            batch["token_rewards"],
            batch["response_mask"],
            batch["group_ids"],
            eps=options.adv_eps,
            norm_by_std=options.norm_adv_by_std,
            return_scores=True,
        )
        return {"advantages": advantages, "scores": scores}
