"""Shared RL maths (DESIGN.md §5): masked reductions, KL estimators, loss aggregation,
the clipped policy loss and the clipped value loss.

Shapes: token matrices are ``[batch, response_len]``; ``mask`` is 1 for response tokens
and 0 for padding. Everything is plain torch, dtype-preserving, usable in float32 or
float64, and independent of Ray and Megatron.
"""

from __future__ import annotations

import torch

LOG_RATIO_CLAMP = 20.0
KL_OUTPUT_CLAMP = 10.0
KL_KINDS = ("k1", "k2", "k3", "low_var_kl", "abs")
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    return (values * mask).sum() if dim is None else (values * mask).sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is set (0 where nothing is set)."""
    mask = mask.to(values.dtype)
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Shift and scale to zero mean, unit (unbiased) variance over the masked entries."""
    mask = mask.to(values.dtype)
    mean = masked_mean(values, mask)
    count = mask.sum()
    var = masked_sum((values - mean) ** 2, mask) / (count - 1).clamp(min=1)
    return (values - mean) * torch.rsqrt(var + eps) * mask


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL(pi || ref) estimate.

    ``k1 = logp - ref``; ``k2 = (logp - ref)^2 / 2``; ``k3`` (alias ``low_var_kl``)
    ``= exp(ref - logp) - (ref - logp) - 1`` with the log-ratio clamped to +-20 and the
    result to +-10 for stability; ``abs = |logp - ref|``.
    """
    diff = logprob - ref_logprob
    if kind == "k1":
        return diff
    if kind == "k2":
        return 0.5 * diff.square()
    if kind == "abs":
        return diff.abs()
    if kind in ("k3", "low_var_kl"):
        log_ratio = (-diff).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return (log_ratio.exp() - log_ratio - 1).clamp(-KL_OUTPUT_CLAMP, KL_OUTPUT_CLAMP)
    raise ValueError(f"unknown KL kind '{kind}'; known: {', '.join(KL_KINDS)}")


def aggregate_loss(
    loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, num_tokens: float | None = None
) -> torch.Tensor:
    """Reduce a ``[batch, T]`` per-token loss to a scalar.

    * ``token-mean``: ``sum(loss * mask) / num_tokens``; pass the token count of the
      whole global batch as ``num_tokens`` so micro-batching and DP do not change the
      result (default: this mask's count).
    * ``seq-mean-token-mean``: mean over sequences of each sequence's token mean.
    * ``seq-mean-token-sum-norm``: mean over sequences of each sequence's token sum
      divided by the padded response length ``T`` (Dr. GRPO's constant normaliser).
    """
    mask = mask.to(loss_mat.dtype)
    if mode == "token-mean":
        denominator = mask.sum() if num_tokens is None else num_tokens
        return masked_sum(loss_mat, mask) / max(float(denominator), 1.0)
    if mode == "seq-mean-token-mean":
        return masked_mean(loss_mat, mask, dim=-1).mean()
    if mode == "seq-mean-token-sum-norm":
        return (masked_sum(loss_mat, mask, dim=-1) / loss_mat.shape[-1]).mean()
    raise ValueError(f"unknown loss aggregation '{mode}'; known: {', '.join(AGG_MODES)}")


def policy_loss(
    old_logprob: torch.Tensor,
    logprob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float | None = None,
    mode: str = "token-mean",
    num_tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate with asymmetric clip range and optional dual clip.

    Per token: ``max(-A * r, -A * clamp(r, 1 - clip_low, 1 + clip_high))`` with
    ``r = exp(clamp(logp - old, -20, 20))``; with ``clip_c`` (> 1) the loss of tokens
    with ``A < 0`` is capped at ``-A * clip_c`` (dual clip).

    Returns:
        The aggregated loss and metrics: ``clip_fraction`` (tokens where the clipped
        branch was taken), ``dual_clip_fraction`` and ``approx_kl`` (mean of old - logp).
    """
    if clip_c is not None and clip_c <= 1.0:
        raise ValueError(f"clip_c must be > 1 for dual clip, got {clip_c}")
    mask = mask.to(logprob.dtype)
    log_ratio = (logprob - old_logprob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    dual = torch.zeros_like(per_token, dtype=torch.bool)
    if clip_c is not None:
        cap = -advantages * clip_c
        dual = (advantages < 0) & (per_token > cap)
        per_token = torch.where(advantages < 0, torch.minimum(per_token, cap), per_token)
    loss = aggregate_loss(per_token, mask, mode, num_tokens)
    metrics = {
        "clip_fraction": float(masked_mean((clipped > unclipped).to(mask.dtype), mask)),
        "dual_clip_fraction": float(masked_mean(dual.to(mask.dtype), mask)),
        "approx_kl": float(masked_mean(-log_ratio.detach(), mask)),
    }
    return loss, metrics


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float = 0.2,
    mode: str = "token-mean",
    num_tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss ``0.5 * max((v - R)^2, (clip(v, old +- clip) - R)^2)``."""
    mask = mask.to(values.dtype)
    clipped_values = old_values + (values - old_values).clamp(-clip, clip)
    unclipped_sq = (values - returns).square()
    clipped_sq = (clipped_values - returns).square()
    per_token = 0.5 * torch.maximum(unclipped_sq, clipped_sq)
    loss = aggregate_loss(per_token, mask, mode, num_tokens)
    frac = masked_mean((clipped_sq > unclipped_sq).to(mask.dtype), mask)
    return loss, {"value_clip_fraction": float(frac)}


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy of the categorical distribution given by ``logits``."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)
