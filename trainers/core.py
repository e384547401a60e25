"""Shared RL maths (docs/architecture.md §6): masked reductions, KL estimators, loss aggregation,
the clipped policy loss and the clipped value loss.

Shapes: token matrices are ``[batch, T]`` (``T`` = padded response length); ``mask`` is
1/True on response tokens and 0/False on padding (a bool or 0/1 float tensor). Padding
values never reach a result, even when they are NaN or inf (``torch.where``, not
``values * mask``). Everything is plain torch: dtype- and device-preserving, float32 or
float64, independent of Ray and Megatron.

Formulas:

* KL estimators of KL(pi || ref) per token, with ``d = logp - ref``:
  ``k1 = d``; ``k2 = d^2 / 2``; ``k3`` (alias ``low_var_kl``) ``= exp(-d) + d - 1`` with
  ``-d`` clamped to [-20, 20] and the result to [-10, 10]; ``abs = |d|``.
* Policy loss per token, ``r = exp(clamp(logp - old, -20, 20))``:
  ``l = max(-A r, -A clamp(r, 1 - clip_low, 1 + clip_high))``; dual clip (``clip_c > 1``)
  for ``A < 0``: ``l = min(l, -A clip_c)``.
* Value loss per token: ``0.5 * max((v - R)^2, (clamp(v, old - clip, old + clip) - R)^2)``.
* Aggregation, see :func:`aggregate_loss`.
* Policy lag (``rollout.max_staleness > 0``), see :func:`behaviour_weights`: each token's
  policy loss is multiplied by ``w = min(exp(old - behaviour), cap)``, detached.

:class:`PolicyGradientAlgorithm` (bottom) is the base of each algorithm file; the contract
it fulfils, :class:`mindrl.algorithm.Algorithm`, lives in mindrl/ so the workers can type it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from mindrl.algorithm import Algorithm, Number
from mindrl.config.schema import AlgorithmConfig
from trainers.granularity import logprobs_at, spread, valid_at

LOG_RATIO_CLAMP = 20.0
KL_OUTPUT_CLAMP = 10.0
KL_KINDS = ("k1", "k2", "k3", "low_var_kl", "abs")
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is set (over everything, or along ``dim``)."""
    kept = torch.where(mask.bool(), values, 0.0)
    return kept.sum() if dim is None else kept.sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is set; 0 where nothing is set.

    Args:
        values: ``[batch, T]`` (any shape broadcastable with ``mask``).
        mask: 1/True where a value counts.
        dim: reduce only along this dimension (e.g. ``-1``: one mean per sequence).
    """
    count = mask.bool().to(values.dtype)
    count = count.sum() if dim is None else count.sum(dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Zero mean, unit unbiased variance over the masked entries; 0 on padding.

    ``(x - mean) / sqrt(var_unbiased + eps)``; a single valid entry has variance 0.
    """
    mean = masked_mean(values, mask)
    count = mask.bool().to(values.dtype).sum()
    var = masked_sum((values - mean).square(), mask) / (count - 1).clamp(min=1)
    whitened = (values - mean) * torch.rsqrt(var + eps)
    return torch.where(mask.bool(), whitened, 0.0)


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || ref), same shape as the inputs.

    Args:
        logprob: log pi(token) of the current policy, ``[batch, T]``.
        ref_logprob: log ref(token) of the reference policy, ``[batch, T]``.
        kind: ``k1``, ``k2``, ``k3`` (= ``low_var_kl``) or ``abs`` (formulas above).

    Raises:
        ValueError: ``kind`` is none of the known estimators.
    """
    diff = logprob - ref_logprob
    if kind == "k1":
        return diff
    if kind == "k2":
        return 0.5 * diff.square()
    if kind == "abs":
        return diff.abs()
    if kind in ("k3", "low_var_kl"):
        # Clamped both sides: exp() of a large log-ratio would overflow float32 first.
        log_ratio = (-diff).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return (log_ratio.exp() - log_ratio - 1).clamp(-KL_OUTPUT_CLAMP, KL_OUTPUT_CLAMP)
    raise ValueError(f"unknown KL kind '{kind}'; known: {', '.join(KL_KINDS)}")


def aggregate_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    num_tokens: Number | None = None,
    *,
    num_seqs: Number | None = None,
    norm_len: int | None = None,
) -> torch.Tensor:
    """Reduce a ``[batch, T]`` per-token loss to a scalar.

    * ``token-mean``: ``sum(loss * mask) / num_tokens``. Pass the valid-token count of
      the whole global batch (all micro-batches, all DP ranks) as ``num_tokens`` and sum
      the micro-batch losses: the result equals the full-batch loss, so gradient
      accumulation and DP do not change it. Default: this mask's count.
    * ``seq-mean-token-mean``: each sequence's token mean, summed and divided by
      ``num_seqs`` (default: the sequences with at least one valid token here).
    * ``seq-mean-token-sum-norm`` (Dr. GRPO): each sequence's token sum divided by the
      constant ``norm_len`` (default ``T = mask.shape[-1]``), then summed and divided by
      ``num_seqs`` (default as above). verl's ``agg_loss`` omits the ``1 / num_seqs``;
      that differs only by a constant factor (the learning-rate scale). Set ``norm_len``
      to the configured max response length when micro-batches are padded differently.

    Denominators below 1 are raised to 1, so an all-padding batch gives 0, not NaN.

    Raises:
        ValueError: ``mode`` is none of the known modes.
    """
    if mode == "token-mean":
        denominator = mask.bool().sum() if num_tokens is None else num_tokens
        return masked_sum(loss_mat, mask) / _at_least_one(denominator, loss_mat)
    if mode in ("seq-mean-token-mean", "seq-mean-token-sum-norm"):
        if mode == "seq-mean-token-mean":
            per_seq = masked_mean(loss_mat, mask, dim=-1)
        else:
            per_seq = masked_sum(loss_mat, mask, dim=-1) / (norm_len or mask.shape[-1])
        denominator = mask.bool().any(-1).sum() if num_seqs is None else num_seqs
        return per_seq.sum() / _at_least_one(denominator, loss_mat)
    raise ValueError(f"unknown loss aggregation '{mode}'; known: {', '.join(AGG_MODES)}")


def _at_least_one(count: Number, like: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(count, dtype=like.dtype, device=like.device).clamp(min=1)


def behaviour_weights(
    old_logprob: torch.Tensor, behaviour_logprob: torch.Tensor, cap: float
) -> torch.Tensor:
    """Truncated importance weights for the policy lag of an off-policy sample, detached.

    A sample generated ``s`` updates ago was drawn from the behaviour policy ``mu`` (the
    rollout's weights), not from the old / proximal policy ``pi_old`` the clipped loss is
    centred on. The decoupled PPO objective of AReaL (Fu et al. 2025, arXiv:2505.24298,
    the section on decoupled PPO) separates the two:

        J = E_{a ~ mu} [ (pi_old / mu) * min(r A, clip(r, 1 - e_low, 1 + e_high) A) ],
        r = pi_theta / pi_old,

    and truncated importance sampling (TIS; Yao et al. 2025, "Your Efficient RL Framework
    Secretly Brings You Off-Policy RL Training") caps the behaviour ratio at ``C`` so one
    token with ``mu`` far below ``pi_old`` cannot dominate the step:

        w_t = min(pi_old(a_t) / mu(a_t), C) = min(exp(old_t - behaviour_t), C).

    With one optimizer step per iteration ``pi_old = pi_theta`` (detached): ``r = 1`` and
    the gradient is TIS's ``min(pi_theta / mu, C) A grad log pi_theta``. The weight is a
    constant of the step (no gradient flows through it); ``log`` differences are clamped
    to [-20, 20] like the ratio, so ``exp`` never overflows.

    Args:
        old_logprob: log pi_old of the sampled tokens, ``[batch, T]``.
        behaviour_logprob: log mu, what the rollout engine reported, ``[batch, T]``.
        cap: ``C`` (> 0); tokens above it are truncated to it.
    """
    log_ratio = (old_logprob - behaviour_logprob).detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return log_ratio.exp().clamp(max=cap)


def policy_loss(
    old_logprob: torch.Tensor,
    logprob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float | None = None,
    mode: str = "token-mean",
    num_tokens: Number | None = None,
    behaviour: tuple[torch.Tensor, float] | None = None,
    **agg_kwargs: Number | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate with asymmetric clip range and optional dual clip.

    Args:
        old_logprob: log-probs of the policy that sampled the tokens, ``[batch, T]``.
        logprob: log-probs of the policy being trained (carries the gradient).
        advantages: per-token advantages, ``[batch, T]``.
        mask: 1 on response tokens.
        clip_low, clip_high: the ratio is clipped to ``[1 - clip_low, 1 + clip_high]``.
        clip_c: dual-clip bound (> 1) for negative advantages; None disables it.
        mode, num_tokens, agg_kwargs: passed to :func:`aggregate_loss`.
        behaviour: ``(behaviour_logprob, cap)`` for samples of an older policy: each
            token's loss (after both clips) is weighted by :func:`behaviour_weights`.

    Returns:
        The loss and detached scalar tensors (no device sync; ``float()`` them when
        logging): ``clip_fraction`` (tokens where the clipped branch is larger),
        ``dual_clip_fraction`` (tokens capped by ``clip_c``) and ``approx_kl``
        (masked mean of ``old - logp``, the k1 estimate of KL(old || pi)); with
        ``behaviour`` also ``is_weight_mean`` and ``is_truncated_fraction`` (weights at
        the cap).

    Raises:
        ValueError: ``clip_c`` is set but not > 1.
    """
    if clip_c is not None and clip_c <= 1.0:
        raise ValueError(f"clip_c must be > 1 for dual clip (got {clip_c}); use None to disable")
    log_ratio = (logprob - old_logprob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    dual = torch.zeros_like(per_token, dtype=torch.bool)
    if clip_c is not None:
        cap = -advantages * clip_c
        dual = (advantages < 0) & (per_token > cap)
        per_token = torch.where(dual, cap, per_token)
    as_fraction = lambda flags: masked_mean(flags.to(logprob.dtype), mask).detach()  # noqa: E731
    metrics = {
        "clip_fraction": as_fraction(clipped > unclipped),
        "dual_clip_fraction": as_fraction(dual),
        "approx_kl": masked_mean(-log_ratio, mask).detach(),
    }
    if behaviour is not None:
        behaviour_logprob, is_cap = behaviour
        weights = behaviour_weights(old_logprob, behaviour_logprob, is_cap)
        per_token = weights * per_token
        metrics["is_weight_mean"] = masked_mean(weights, mask).detach()
        metrics["is_truncated_fraction"] = as_fraction(weights >= is_cap)
    loss = aggregate_loss(per_token, mask, mode, num_tokens, **agg_kwargs)
    return loss, metrics


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float = 0.2,
    mode: str = "token-mean",
    num_tokens: Number | None = None,
    **agg_kwargs: Number | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss ``0.5 * max((v - R)^2, (clamp(v, old +- clip) - R)^2)``.

    Args:
        values: critic predictions being trained, ``[batch, T]``.
        old_values: critic predictions when the batch was made (the clip centre).
        returns: GAE returns (targets), ``[batch, T]``.
        mask: 1 on response tokens.
        clip: half-width of the trust region around ``old_values``.
        mode, num_tokens, agg_kwargs: passed to :func:`aggregate_loss`.

    Returns:
        The loss and detached metrics ``value_clip_fraction`` (tokens where the
        clipped branch is larger) and ``value_mean`` (masked mean prediction).
    """
    clipped_values = old_values + (values - old_values).clamp(-clip, clip)
    unclipped_sq = (values - returns).square()
    clipped_sq = (clipped_values - returns).square()
    per_token = 0.5 * torch.maximum(unclipped_sq, clipped_sq)
    loss = aggregate_loss(per_token, mask, mode, num_tokens, **agg_kwargs)
    metrics = {
        "value_clip_fraction": masked_mean((clipped_sq > unclipped_sq).to(values.dtype), mask),
        "value_mean": masked_mean(values, mask),
    }
    return loss, {name: value.detach() for name, value in metrics.items()}


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy ``[batch, T]`` of the categorical given by ``logits`` ``[..., V]``."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


# --- The loss every policy-gradient algorithm file shares -------------------------------


class PolicyGradientAlgorithm(Algorithm):
    """An :class:`~mindrl.algorithm.Algorithm` whose actor loss is the clipped surrogate
    below, plus ``kl_coef`` x KL to the reference and minus ``entropy_coef`` x entropy."""

    additive_metrics = frozenset({"pg_loss"})  # the loss itself, normalised by global counts

    def actor_loss(
        self,
        logprob: torch.Tensor,
        batch: Mapping[str, torch.Tensor],
        options: AlgorithmConfig,
        num_tokens: Number | None = None,
        entropy: torch.Tensor | None = None,
        num_seqs: Number | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Clipped policy loss + kl_coef * KL - entropy_coef * entropy, one micro-batch.

        Args:
            logprob: ``[batch, T]`` log-probs of the policy being trained.
            batch: ``advantages``, ``response_mask``, ``old_logprob`` (absent: on-policy,
                ``logprob.detach()`` is used), ``ref_logprob`` when KL is used and
                ``behaviour_logprob`` for samples of an older policy (off-policy: the
                loss is weighted by :func:`behaviour_weights`, capped at
                ``options.behaviour_is_cap``).
            options: resolved options (see :meth:`resolve`).
            num_tokens: global-batch token count for token-mean (see aggregate_loss).
            entropy: ``[batch, T]`` per-token entropy, for the bonus and the metric.
            num_seqs: global-batch sequence count for the seq-mean modes.

        Returns:
            The loss and detached metrics (policy-loss metrics, ``kl``, ``entropy``).
        """
        mask = batch["response_mask"]
        old = batch.get("old_logprob")
        old = logprob.detach() if old is None else old
        mode = options.loss_agg_mode
        behaviour = batch.get("behaviour_logprob")
        behaviour = None if behaviour is None else (behaviour, options.behaviour_is_cap)
        counts = {"num_seqs": num_seqs, "norm_len": options.norm_len}
        loss, metrics = policy_loss(
            old, logprob, batch["advantages"], mask, options.clip_low, options.clip_high,
            options.clip_c, mode, num_tokens, behaviour, **counts,
        )  # fmt: skip
        metrics["pg_loss"] = loss.detach()
        if options.kl_coef > 0:
            kl = kl_penalty(logprob, batch["ref_logprob"], options.kl_kind)
            kl_loss = aggregate_loss(kl, mask, mode, num_tokens, **counts)
            loss = loss + options.kl_coef * kl_loss
            metrics["kl"] = masked_mean(kl, mask).detach()
        if entropy is not None:
            metrics["entropy"] = masked_mean(entropy, mask).detach()
            if options.entropy_coef > 0:
                bonus = aggregate_loss(entropy, mask, mode, num_tokens, **counts)
                loss = loss - options.entropy_coef * bonus
        return loss, metrics

    def episode_advantages(
        self, returns: torch.Tensor, group_ids: torch.Tensor, options: AlgorithmConfig
    ) -> torch.Tensor:
        """``[episodes]`` advantages: each episode's return is one response's score, so
        a group algorithm's own statistics (GRPO: the group's mean and std) apply as to
        text responses."""
        scores = returns.unsqueeze(-1)
        batch = {
            "token_rewards": scores,
            "response_mask": torch.ones_like(scores, dtype=torch.bool),
            "group_ids": group_ids,
        }
        return self.compute_advantages(batch, options)["advantages"][:, 0]

    def valid_units(
        self,
        valid: torch.Tensor,
        options: AlgorithmConfig,
        action_dims: int,
        level: str | None = None,
    ) -> int:
        """Units of ``level`` (default ``options.logprob_level``) the valid actions
        ``[..., C]`` hold (a chunk while any of its actions is valid, a token while its
        action is)."""
        return int(valid_at(valid, level or options.logprob_level, action_dims).sum())

    def chunk_value_loss(
        self,
        values: torch.Tensor,
        batch: Mapping[str, torch.Tensor],
        options: AlgorithmConfig,
        num_units: Number,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """:meth:`critic_loss` of the value head's ``values [rows, width(reward_level)]``
        against ``returns`` around ``old_values`` (same shape), on the units of
        ``options.reward_level`` that ``valid [rows, C]`` leaves (a chunk while any of
        its actions is valid), each weighing ``1 / num_units``."""
        units = {
            "old_values": batch["old_values"],
            "returns": batch["returns"],
            "response_mask": valid_at(batch["valid"], options.reward_level, action_dims=1),
        }
        return self.critic_loss(values, units, options, num_tokens=num_units)

    def chunk_actor_loss(
        self,
        token_logprobs: torch.Tensor,
        token_entropy: torch.Tensor,
        batch: Mapping[str, torch.Tensor],
        options: AlgorithmConfig,
        action_dims: int,
        num_units: Number,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """:meth:`actor_loss` with a unit of ``options.logprob_level`` as its token: the
        ratio of a chunk or an action is the exponent of its tokens' summed log-probs,
        and so is its entropy a sum (by the chain rule a sum of the tokens' conditional
        entropies is the joint's, in expectation). ``batch``: ``old_logprob [rows, C*A]``,
        ``advantages [rows, width(reward_level)]`` (spread onto the log-prob level),
        ``valid [rows, C]`` (the actions the environment applied); each valid unit
        weighs ``1 / num_units``, the global batch's count (trainers/granularity.py)."""
        level, valid = options.logprob_level, batch["valid"]
        chunk_size = valid.shape[-1]
        units = {
            "advantages": spread(
                batch["advantages"], options.reward_level, level, chunk_size, action_dims
            ),
            "response_mask": valid_at(valid, level, action_dims),
            "old_logprob": logprobs_at(batch["old_logprob"], level, action_dims),
        }
        return self.actor_loss(
            logprobs_at(token_logprobs, level, action_dims),
            units,
            options,
            num_tokens=num_units,
            entropy=logprobs_at(token_entropy, level, action_dims),
        )
