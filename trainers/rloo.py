"""RLOO: REINFORCE with a leave-one-out baseline (Kool et al. 2019, "Buy 4 REINFORCE
samples, get a baseline for free!"; Ahmadian et al. 2024, arXiv:2402.14740, its RLOO
estimator).

Each prompt's k responses form a group (by id, as in GRPO). Response ``i`` scores
``s_i = sum_t r_it * mask_it``; its baseline is the mean score of the *other* responses
of its group, so the advantage is

    A_i = s_i - 1/(k-1) * sum_{j != i} s_j  =  k/(k-1) * (s_i - mean_g)

broadcast over its response tokens and zero on padding. No std normalisation: the
baseline is unbiased because it never sees the sample it scores. A group of one has no
other sample, so its baseline is 0 and its advantage its own score (as in GRPO).

Defaults: no KL (the paper puts a KL penalty in the reward; here ``kl_coef`` adds it to
the loss, as in GRPO), token-mean loss.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from mindrl.config.schema import AlgorithmConfig
from trainers.core import PolicyGradientAlgorithm, masked_sum
from trainers.grpo import GroupIds, group_index


def leave_one_out_advantages(
    token_rewards: torch.Tensor, mask: torch.Tensor, group_ids: GroupIds
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO advantages ``[batch, T]`` (zero on padding) and the scores ``[batch]``.

    Args:
        token_rewards: ``[batch, T]`` rewards (usually one non-zero, at the last token).
        mask: ``[batch, T]`` 1 on response tokens.
        group_ids: ``[batch]`` ids (tensor, or a list of any hashable).
    """
    scores = masked_sum(token_rewards, mask, dim=-1)
    index, n_groups = group_index(group_ids, scores.shape[0], scores.device)
    zeros = scores.new_zeros(n_groups)
    group_sum = zeros.index_add(0, index, scores)[index]
    count = zeros.index_add(0, index, torch.ones_like(scores))[index]
    # The others' mean; a group of one has no others, so its baseline is 0.
    baseline = torch.where(count > 1, (group_sum - scores) / (count - 1).clamp(min=1), 0.0)
    advantages = torch.where(mask.bool(), (scores - baseline).unsqueeze(-1), 0.0)
    return advantages, scores


class RLOO(PolicyGradientAlgorithm):
    """REINFORCE with the leave-one-out baseline; the shared clipped loss (one step per
    iteration makes it plain REINFORCE), KL to the reference in the loss when set."""

    name = "rloo"
    uses_groups = True
    group_local_advantages = True  # each baseline is the group's other responses
    needs_reference = False
    defaults: ClassVar[dict[str, object]] = {"kl_coef": 0.0, "loss_agg_mode": "token-mean"}

    def compute_advantages(
        self, batch: Mapping[str, torch.Tensor], options: AlgorithmConfig
    ) -> dict[str, torch.Tensor]:
        """``advantages``, ``scores`` from ``token_rewards``, ``response_mask``, ``group_ids``."""
        advantages, scores = leave_one_out_advantages(
            batch["token_rewards"], batch["response_mask"], batch["group_ids"]
        )
        return {"advantages": advantages, "scores": scores}
