"""Dr. GRPO: GRPO "done right" (Liu et al. 2025, "Understanding R1-Zero-Like Training: A
Critical Perspective", arXiv:2503.20783, §3.1).

The paper shows two biases in GRPO's objective: dividing each response's loss
by its own length ``|o_i|`` favours long wrong answers (their per-token penalty shrinks)
and dividing the advantage by the group's reward std over-weights prompts that are too
easy or too hard. Dr. GRPO removes both:

* advantage ``A_i = s_i - mean_g`` (GRPO's group mean, no std:
  :func:`trainers.grpo.compute_advantages` with ``norm_by_std=False``);
* loss: each response's token-loss *sum*, divided by one constant for every response,
  then averaged over responses: :func:`trainers.core.aggregate_loss`'s
  ``seq-mean-token-sum-norm``; the constant is the generation budget,
  ``rollout.max_response_length``, the same for every batch
  (``algorithm.norm_len`` sets another; :func:`mindrl.algorithm.run_options`).

Everything else is GRPO's: the clipped surrogate, KL to the reference when ``kl_coef``
is set (default off, as in the paper's recipe).
"""

from __future__ import annotations

from typing import ClassVar

from trainers.grpo import GRPO


class DrGRPO(GRPO):
    """GRPO without the std normalisation and without per-response length normalisation."""

    name = "dr_grpo"
    needs_reference = False
    defaults: ClassVar[dict[str, object]] = {
        "kl_coef": 0.0,
        "norm_adv_by_std": False,
        "loss_agg_mode": "seq-mean-token-sum-norm",
    }
