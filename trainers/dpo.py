"""DPO: direct preference optimisation on offline pairs (Rafailov et al. 2023,
arXiv:2305.18290, Eq. 7), with IPO's loss as an option (Azar et al. 2023,
arXiv:2310.12036, Eq. 17).

A pair is a prompt ``x`` with a chosen response ``y_w`` and a rejected one ``y_l``. With
sequence log-probs ``log pi(y | x) = sum_t logp_t * mask_t`` of the policy and of the
frozen reference, each response's implicit reward is

    r(y) = beta * (log pi(y | x) - log ref(y | x))

and, with the margin ``h = (r(y_w) - r(y_l)) / beta``,

* ``sigmoid`` (DPO, Eq. 7): ``loss = -log sigmoid(beta * h)``;
* ``ipo`` (IPO, Eq. 17): ``loss = (h - 1 / (2 * beta))^2``, a squared loss that does not
  push the margin to infinity on separable pairs.

The loss is the mean over the pairs of the global batch. Metrics (the paper's Fig. 2 quantities):
``preference_accuracy`` (share of pairs with ``r(y_w) > r(y_l)``), ``chosen_reward``,
``rejected_reward`` and ``reward_margin`` (means over pairs). Like the loss, each metric a
micro-batch reports is its share of the global batch's figure (its pairs' sum over the
global pair count), so the update adds them up (``additive_metrics``) into the exact
count / total over every pair of the step, whatever the micro-batch and DP-rank sizes; a
mean of micro-batch means would weigh the pairs of a short micro-batch more.

Defaults: ``dpo_beta`` 0.1 (the paper's), ``dpo_loss`` ``sigmoid``.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F

from mindrl.algorithm import Algorithm, Batch, LossAndMetrics
from mindrl.config.schema import AlgorithmConfig
from trainers.core import Number, _at_least_one, masked_mean, masked_sum

DPO_LOSSES = ("sigmoid", "ipo")
#: Metrics that are a micro-batch's share of the global batch's mean (module docstring).
PREFERENCE_METRICS = ("preference_accuracy", "chosen_reward", "rejected_reward", "reward_margin")


def sequence_logprob(logprob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``log pi(y | x)`` ``[batch]``: the sum of a response's token log-probs."""
    return masked_sum(logprob, mask, dim=-1)


def preference_loss(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
    loss_type: str = "sigmoid",
    num_pairs: Number | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DPO / IPO loss (module docstring) from sequence log-probs ``[pairs]``.

    Args:
        chosen, rejected: the policy's ``log pi(y_w | x)`` and ``log pi(y_l | x)``.
        ref_chosen, ref_rejected: the reference's, for the same responses.
        beta: the KL strength (DPO's temperature; IPO's regulariser ``tau``).
        loss_type: ``sigmoid`` (DPO) or ``ipo``.
        num_pairs: the pair count of the whole global batch (all micro-batches, all DP
            ranks): summed micro-batch losses then equal the full-batch mean, as with
            ``aggregate_loss``'s ``num_tokens``. Default: the pairs given here.

    Returns:
        The loss and detached metrics (module docstring): the given pairs' share of the
        global batch's means (the means themselves when ``num_pairs`` is not given).

    Raises:
        ValueError: ``beta`` is not positive, or ``loss_type`` is unknown.
    """
    if beta <= 0:
        raise ValueError(f"DPO beta must be > 0, got {beta}")
    margin = (chosen - ref_chosen) - (rejected - ref_rejected)
    if loss_type == "sigmoid":
        # logsigmoid, not log(sigmoid()): stays finite for large negative margins.
        losses = -F.logsigmoid(beta * margin)
    elif loss_type == "ipo":
        losses = (margin - 1.0 / (2.0 * beta)).square()
    else:
        raise ValueError(f"unknown DPO loss '{loss_type}'; known: {', '.join(DPO_LOSSES)}")
    count = _at_least_one(len(losses) if num_pairs is None else num_pairs, losses)
    chosen_reward = beta * (chosen - ref_chosen).detach()
    rejected_reward = beta * (rejected - ref_rejected).detach()
    per_pair = {
        "preference_accuracy": (chosen_reward > rejected_reward).to(chosen.dtype),
        "chosen_reward": chosen_reward,
        "rejected_reward": rejected_reward,
        "reward_margin": chosen_reward - rejected_reward,
    }
    metrics = {name: values.sum() / count for name, values in per_pair.items()}
    return losses.sum() / count, metrics


class DPO(Algorithm):
    """Offline preference optimisation: no rollout, no reward, no advantages.

    A batch holds pairs as consecutive rows, chosen then rejected (row ``2k`` is pair
    ``k``'s ``y_w``, row ``2k + 1`` its ``y_l``), with ``ref_logprob`` from the
    reference role.
    """

    name = "dpo"
    needs_reference = True
    uses_groups = True  # a pair is a group of two responses to one prompt
    defaults: ClassVar[dict[str, object]] = {"dpo_beta": 0.1, "dpo_loss": "sigmoid"}
    own_options = frozenset({"dpo_beta", "dpo_loss"})
    reads_options = own_options  # no clipping, KL coefficient, advantages or entropy bonus
    additive_metrics = frozenset(PREFERENCE_METRICS)
    offline = True  # stored pairs: no generation, reward or advantage stage

    def uses_reference(self, options: AlgorithmConfig) -> bool:
        """Always: the implicit reward is measured against the reference policy."""
        return True

    def compute_advantages(self, batch: Batch, options: AlgorithmConfig) -> dict[str, torch.Tensor]:
        """DPO has no advantages; the preference loss reads log-probs only.

        Raises:
            NotImplementedError: always (an offline run has no advantage stage).
        """
        raise NotImplementedError("dpo trains on preference pairs and has no advantage stage")

    def actor_loss(
        self,
        logprob: torch.Tensor,
        batch: Batch,
        options: AlgorithmConfig,
        num_tokens: Number | None = None,
        entropy: torch.Tensor | None = None,
        num_seqs: Number | None = None,
    ) -> LossAndMetrics:
        """The DPO / IPO loss of the micro-batch's pairs (``num_seqs`` / 2 pairs in the
        global batch) and its metrics, plus the policy's ``entropy``.

        Raises:
            ValueError: an odd number of rows (a pair split across micro-batches).
        """
        mask = batch["response_mask"]
        if logprob.shape[0] % 2:
            raise ValueError(f"dpo needs whole pairs per micro-batch, got {logprob.shape[0]} rows")
        policy = sequence_logprob(logprob, mask)
        reference = sequence_logprob(batch["ref_logprob"], mask)
        num_pairs = None if num_seqs is None else num_seqs / 2
        loss, metrics = preference_loss(
            policy[0::2], policy[1::2], reference[0::2], reference[1::2], options.dpo_beta,
            options.dpo_loss, num_pairs,
        )  # fmt: skip
        if entropy is not None:
            metrics["entropy"] = masked_mean(entropy, mask).detach()
        return loss, metrics
