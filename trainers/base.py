"""What every algorithm file provides: defaults, advantages and the actor loss.

An :class:`Algorithm` is stateless maths; the pipeline calls it with plain tensors.
Options come from the config's ``algorithm`` section, with each algorithm's own
defaults filling what the config leaves unset (``None``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from mindrl.config import AlgorithmConfig
from trainers.core import kl_penalty, masked_mean, policy_loss


@dataclass(frozen=True)
class AlgorithmOptions:
    """Resolved options (no ``None`` left where a default exists)."""

    kl_coef: float
    kl_kind: str
    clip_low: float
    clip_high: float
    clip_c: float | None
    loss_agg_mode: str
    entropy_coef: float
    norm_adv_by_std: bool
    gamma: float
    lam: float
    value_clip: float
    dynamic_sampling: bool
    max_sample_batches: int
    overlong_buffer: int
    overlong_factor: float


class Algorithm(ABC):
    """One RL algorithm. Subclasses set the class attributes and the advantage maths."""

    name: str
    needs_critic: bool = False
    uses_groups: bool = False
    defaults: ClassVar[dict[str, object]] = {}

    def resolve(self, config: AlgorithmConfig) -> AlgorithmOptions:
        values = {k: getattr(config, k) for k in AlgorithmOptions.__dataclass_fields__}
        for key, default in self.defaults.items():
            if values[key] is None:
                values[key] = default
        return replace(AlgorithmOptions(**values))

    def needs_reference(self, options: AlgorithmOptions) -> bool:
        """A reference model is only worth computing when KL is penalised."""
        return options.kl_coef > 0

    @abstractmethod
    def compute_advantages(
        self, batch: dict[str, torch.Tensor], options: AlgorithmOptions
    ) -> dict[str, torch.Tensor]:
        """Advantages (and returns for critics) from rewards, masks and group ids."""

    def actor_loss(
        self,
        logprob: torch.Tensor,
        batch: dict[str, torch.Tensor],
        options: AlgorithmOptions,
        num_tokens: float | None = None,
        entropy: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Clipped policy loss + KL penalty - entropy bonus for one micro-batch.

        ``batch`` holds ``old_logprob`` (or none: on-policy, then ``logprob.detach()``),
        ``advantages``, ``response_mask`` and, when KL is used, ``ref_logprob``.
        """
        mask = batch["response_mask"]
        old = batch.get("old_logprob")
        old = logprob.detach() if old is None else old
        loss, metrics = policy_loss(
            old,
            logprob,
            batch["advantages"],
            mask,
            options.clip_low,
            options.clip_high,
            options.clip_c,
            options.loss_agg_mode,
            num_tokens,
        )
        if options.kl_coef > 0:
            kl = kl_penalty(logprob, batch["ref_logprob"], options.kl_kind)
            loss = loss + options.kl_coef * _aggregate(kl, mask, options, num_tokens)
            metrics["kl"] = float(masked_mean(kl.detach(), mask))
        if entropy is not None:
            metrics["entropy"] = float(masked_mean(entropy.detach(), mask))
            if options.entropy_coef > 0:
                loss = loss - options.entropy_coef * _aggregate(entropy, mask, options, num_tokens)
        return loss, metrics


def _aggregate(values, mask, options, num_tokens):
    from trainers.core import aggregate_loss

    return aggregate_loss(values, mask, options.loss_agg_mode, num_tokens)
