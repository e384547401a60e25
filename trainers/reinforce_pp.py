"""REINFORCE++ (Hu et al. 2025, arXiv:2501.03262, §3 "token-level KL penalty" and
"advantage normalization"): no critic, no groups, a token-level KL penalty in the
reward and advantages normalised over the whole global batch.

Per token: ``r_t = 1[t = last] * r(x, y) - beta * KL_t`` with
``KL_t = kl_penalty(old_t, ref_t)`` (k1 = ``log pi_old / pi_ref`` in the paper; the
configured estimator here). The return is the discounted reward-to-go
``G_t = sum_{s >= t} gamma^(s - t) r_s`` and the advantage is ``G_t`` whitened over all
valid tokens of the global batch, the paper's replacement for a critic or a
per-prompt baseline. The loss is PPO's clipped surrogate; the KL is already in the
reward, so it is not added to the loss again.

The reward-to-go is GAE with ``V = 0`` and ``lambda = 1`` (``delta_t = r_t``), and GAE
already whitens over the batch, so :func:`reinforce_pp_advantages` is
:func:`trainers.ppo.compute_gae` on the shaped rewards with zero values.
"""

from __future__ import annotations

import torch

from trainers.core import kl_penalty
from trainers.ppo import compute_gae


@torch.no_grad()
def kl_shaped_rewards(
    token_rewards: torch.Tensor,
    old_logprob: torch.Tensor,
    ref_logprob: torch.Tensor,
    mask: torch.Tensor,
    kl_coef: float,
    kl_kind: str,
) -> torch.Tensor:
    """``r_t - kl_coef * KL_t`` on response tokens, 0 on padding."""
    kl = kl_penalty(old_logprob, ref_logprob, kl_kind)
    return torch.where(mask.bool(), token_rewards - kl_coef * kl, 0.0)


def reinforce_pp_advantages(
    token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages, returns)`` ``[batch, T]``: reward-to-go, whitened over the batch."""
    return compute_gae(token_rewards, torch.zeros_like(token_rewards), mask, gamma, 1.0)
