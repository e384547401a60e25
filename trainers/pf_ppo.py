"""PF-PPO: policy filtration for PPO (Zhang, Shen et al. 2024, "Policy Filtration in
RLHF to Fine-Tune LLM for Code Generation", arXiv:2409.06957, §4).

PPO trains on every sampled response, but a reward model is most reliable at the ends
of its range. PF-PPO samples N responses per prompt, ranks them by reward and keeps only
the responses whose rewards it trusts: the best ones ("BoN"), the best and the worst
("BW", the paper's strongest variant) or the worst. Here ``pf_filter_ratio`` is the share
of each group kept, ``k = max(1, round(ratio * N))``, and ``pf_filter_mode`` picks

* ``best``: the k highest rewards;  * ``worst``: the k lowest;
* ``both``: ``ceil(k / 2)`` highest and ``floor(k / 2)`` lowest.

Ties break by position in the group (stable sort), so the filter is deterministic.

The filtered-out responses get advantage 0, so they give no policy gradient (the clipped
surrogate is ``-A * ratio`` = 0), and the advantages are whitened over the kept tokens
only. The critic still regresses on every response's GAE return (more data for the
value, and the returns do not depend on the filter).

Defaults: PPO's, plus ``pf_filter_ratio`` 0.5 and ``pf_filter_mode`` ``both`` (the
paper's best-worst variant, keeping both trustworthy ends of each group).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from mindrl.config.schema import AlgorithmConfig
from trainers.core import masked_sum, masked_whiten
from trainers.grpo import GroupIds, group_index
from trainers.ppo import PPO, compute_gae

FILTER_MODES = ("best", "worst", "both")


def filter_by_reward(
    scores: torch.Tensor, group_ids: GroupIds, ratio: float, mode: str
) -> torch.Tensor:
    """Keep-mask ``[batch]`` (bool) of the responses PF-PPO trains on (module docstring).

    Args:
        scores: ``[batch]`` sequence rewards.
        group_ids: ``[batch]`` group ids (tensor, or a list of any hashable).
        ratio: share of each group kept, in (0, 1].
        mode: ``best``, ``worst`` or ``both``.

    Raises:
        ValueError: an unknown mode or a ratio outside (0, 1].
    """
    if mode not in FILTER_MODES:
        raise ValueError(f"unknown PF-PPO filter mode '{mode}'; known: {', '.join(FILTER_MODES)}")
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"PF-PPO filter ratio must be in (0, 1], got {ratio}")
    index, _ = group_index(group_ids, scores.shape[0], scores.device)
    keep = torch.zeros(scores.shape[0], dtype=torch.bool, device=scores.device)
    for group in index.unique():
        members = (index == group).nonzero().squeeze(-1)
        # Stable: equal rewards keep their order, lowest first.
        ranked = members[torch.sort(scores[members], stable=True).indices]
        k = max(1, round(ratio * len(members)))
        top = {"best": k, "worst": 0, "both": (k + 1) // 2}[mode]
        keep[ranked[len(ranked) - top :]] = True
        keep[ranked[: k - top]] = True
    return keep


def filtered_gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    keep: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages, returns)`` ``[batch, T]``: GAE returns for every response, and the
    advantages whitened over the kept responses' tokens, 0 on the others."""
    _, returns = compute_gae(token_rewards, values, mask, gamma, lam)
    kept_mask = mask.bool() & keep.unsqueeze(-1)
    # GAE's raw advantage is returns - values (compute_gae defines returns = A + V).
    return masked_whiten(returns - values, kept_mask), returns


class PFPPO(PPO):
    """PPO trained on the responses the reward filter keeps (module docstring)."""

    name = "pf_ppo"
    uses_groups = True  # the filter ranks the responses of one prompt
    chunk_value_head = False  # its filter is not built for embodied episodes
    defaults: ClassVar[dict[str, object]] = {
        **PPO.defaults,
        "pf_filter_ratio": 0.5,
        "pf_filter_mode": "both",
    }
    own_options = frozenset({"pf_filter_ratio", "pf_filter_mode"})

    def compute_advantages(
        self, batch: Mapping[str, torch.Tensor], options: AlgorithmConfig
    ) -> dict[str, torch.Tensor]:
        """``advantages`` (0 on filtered responses) and ``returns`` from ``token_rewards``,
        ``values``, ``response_mask`` and ``group_ids``."""
        mask = batch["response_mask"]
        scores = masked_sum(batch["token_rewards"], mask, dim=-1)
        keep = filter_by_reward(
            scores, batch["group_ids"], options.pf_filter_ratio, options.pf_filter_mode
        )
        advantages, returns = filtered_gae(
            batch["token_rewards"], batch["values"], mask, keep, options.gamma, options.lam
        )
        return {"advantages": advantages, "returns": returns}
