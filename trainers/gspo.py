"""GSPO: Group Sequence Policy Optimization (Zheng et al. 2025, arXiv:2507.18071).

Advantages are GRPO's group-normalised scores (Eq. 6). The importance ratio is one per
*sequence*, length-normalised (Eq. 7):

    s_i = (pi(y_i | x) / pi_old(y_i | x)) ** (1 / |y_i|) = exp(mean_t(logp_it - old_it))

and the objective clips it per sequence (Eq. 5):
``J = 1/G sum_i min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)``.

It reuses the token-level clipped loss through the paper's GSPO-token form (Eq. 13-14):
each token gets the log-ratio ``sg[log s_i] + logp_it - sg[logp_it]``, whose *value* is
``log s_i`` on every token of the sequence (so clipping is decided per sequence) and
whose gradient is ``grad logp_it``. With ``seq-mean-token-mean`` aggregation the
gradient is ``1/G sum_i A_i s_i 1/|y_i| sum_t grad logp_it`` = Eq. 10, GSPO's own.
The token loss computes ``logp - old``, so handing it the constant "old" log-probs
``sg[logp_it] - sg[log s_i]`` gives exactly that log-ratio.
"""

from __future__ import annotations

import torch

from trainers.core import masked_mean


def sequence_log_ratio(
    logprob: torch.Tensor, old_logprob: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """``log s_i`` ``[batch]``: the mean per-token log-ratio of each response (Eq. 7)."""
    return masked_mean(logprob - old_logprob, mask, dim=-1)


def sequence_level_old_logprob(
    logprob: torch.Tensor, old_logprob: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Constant "old" log-probs ``[batch, T]`` that make the token-level clipped loss
    GSPO's: ``sg[logp_it] - sg[log s_i]`` (module docstring), no gradient."""
    seq = sequence_log_ratio(logprob, old_logprob, mask).unsqueeze(-1)
    return (logprob - seq).detach()
