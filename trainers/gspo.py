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

Defaults: the clip range of the paper's experiments, ``eps_low = 3e-4`` and
``eps_high = 4e-4``; no KL; ``seq-mean-token-mean`` (the only aggregation that is Eq. 5;
others are refused).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from mindrl.config.schema import AlgorithmConfig
from trainers.core import Number, masked_mean
from trainers.grpo import GRPO


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


class GSPO(GRPO):
    """GRPO advantages with GSPO's sequence-level ratio and clipping (module docstring)."""

    name = "gspo"
    needs_reference = False
    # Its ratio is per sequence: the per-token behaviour weights that correct a resumed or
    # a stale response do not apply to it.
    supports_partial_rollout = False
    supports_stale_rollouts = False
    # The paper's clip range: a sequence ratio (a mean of log-ratios) moves far less.
    defaults: ClassVar[dict[str, object]] = {
        "kl_coef": 0.0,
        "clip_low": 3e-4,
        "clip_high": 4e-4,
        "loss_agg_mode": "seq-mean-token-mean",
    }

    def resolve(self, section: object = None) -> AlgorithmConfig:
        """GRPO's resolution, refusing an aggregation that is not GSPO's objective.

        Raises:
            ValueError: ``loss_agg_mode`` is not ``seq-mean-token-mean`` (any other mode
                weights a sequence's ratio by its length, which Eq. 5 does not).
        """
        options = super().resolve(section)
        if options.loss_agg_mode != "seq-mean-token-mean":
            raise ValueError(
                f"algorithm.loss_agg_mode={options.loss_agg_mode}: gspo averages one clipped "
                "sequence ratio per response (GSPO Eq. 5), which is seq-mean-token-mean; "
                "leave it unset"
            )
        return options

    def actor_loss(
        self,
        logprob: torch.Tensor,
        batch: Mapping[str, torch.Tensor],
        options: AlgorithmConfig,
        num_tokens: Number | None = None,
        entropy: torch.Tensor | None = None,
        num_seqs: Number | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The shared loss with GSPO's sequence ratio: ``approx_kl`` is then the mean
        sequence-level log-ratio; KL and entropy use the token log-probs."""
        old = batch.get("old_logprob")
        old = logprob.detach() if old is None else old
        sequence_old = sequence_level_old_logprob(logprob, old, batch["response_mask"])
        batch = {**batch, "old_logprob": sequence_old}
        return super().actor_loss(logprob, batch, options, num_tokens, entropy, num_seqs)
