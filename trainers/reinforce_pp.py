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

Defaults: ``kl_coef`` 0, token-mean loss, ``gamma`` 1. With ``kl_coef`` > 0 the run plan
adds the reference role and hands the advantage stage ``ref_logprob`` and the rollout's
log-probs (:meth:`ReinforcePP.advantage_inputs`); an adaptive coefficient is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar

import torch

from mindrl.config.schema import AlgorithmConfig
from trainers.core import Number, PolicyGradientAlgorithm, kl_penalty
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


class ReinforcePP(PolicyGradientAlgorithm):
    """REINFORCE++: KL-shaped reward-to-go, whitened over the batch; the clipped loss."""

    name = "reinforce_pp"
    needs_reference = False
    defaults: ClassVar[dict[str, object]] = {"kl_coef": 0.0, "loss_agg_mode": "token-mean"}

    def resolve(self, section: object = None) -> AlgorithmConfig:
        """The base resolution, refusing an adaptive KL coefficient.

        Raises:
            ValueError: ``adaptive_kl``: the KL enters the reward at the advantage stage,
                which reads the configured coefficient, not the controller's.
        """
        options = super().resolve(section)
        if options.adaptive_kl:
            raise ValueError(
                "algorithm.adaptive_kl: reinforce_pp puts the KL penalty in the reward at the "
                "advantage stage, which uses the fixed kl_coef; set kl_coef instead"
            )
        return options

    def advantage_inputs(self, options: AlgorithmConfig) -> tuple[str, ...]:
        """With a KL coefficient: the reference's and the sampling policy's log-probs."""
        return ("ref_logprob", "rollout_logprob") if options.kl_coef > 0 else ()

    def compute_advantages(
        self, batch: Mapping[str, torch.Tensor], options: AlgorithmConfig
    ) -> dict[str, torch.Tensor]:
        """``advantages`` from ``token_rewards`` and ``response_mask`` (no groups); with a
        KL coefficient the rewards are first shaped with ``rollout_logprob`` (the sampling
        policy, pi_old) and ``ref_logprob``."""
        rewards, mask = batch["token_rewards"], batch["response_mask"]
        if options.kl_coef > 0:
            rewards = kl_shaped_rewards(
                rewards, batch["rollout_logprob"], batch["ref_logprob"], mask, options.kl_coef,
                options.kl_kind,
            )  # fmt: skip
        advantages, _ = reinforce_pp_advantages(rewards, mask, options.gamma)
        return {"advantages": advantages}

    def actor_loss(
        self,
        logprob: torch.Tensor,
        batch: Mapping[str, torch.Tensor],
        options: AlgorithmConfig,
        num_tokens: Number | None = None,
        entropy: torch.Tensor | None = None,
        num_seqs: Number | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The shared clipped loss without a KL term: the KL is already in the reward."""
        no_kl = dataclasses.replace(options, kl_coef=0.0)
        return super().actor_loss(logprob, batch, no_kl, num_tokens, entropy, num_seqs)
