"""Independent float64 references for the algorithm maths: plain Python loops over
samples and tokens on nested lists (no torch), written from DESIGN.md §5."""

from __future__ import annotations

import math
import statistics


def rows(tensor) -> list:
    return tensor.double().tolist() if hasattr(tensor, "double") else list(tensor)


def masked_mean(values, mask) -> float:
    total, count = 0.0, 0
    for value_row, mask_row in zip(rows(values), rows(mask), strict=True):
        for value, keep in zip(value_row, mask_row, strict=True):
            if keep:
                total, count = total + value, count + 1
    return total / count if count else 0.0


def kl(logp: float, ref: float, kind: str) -> float:
    d = logp - ref
    if kind == "k1":
        return d
    if kind == "k2":
        return d * d / 2
    if kind == "abs":
        return abs(d)
    log_ratio = min(max(ref - logp, -20.0), 20.0)
    return min(max(math.exp(log_ratio) - log_ratio - 1, -10.0), 10.0)


def aggregate(loss, mask, mode, num_tokens=None, num_seqs=None, norm_len=None) -> float:
    loss, mask = rows(loss), rows(mask)
    length = len(mask[0])
    if mode == "token-mean":
        total = sum(
            v for lr, mr in zip(loss, mask, strict=True) for v, m in zip(lr, mr, strict=True) if m
        )
        count = sum(1 for mr in mask for m in mr if m) if num_tokens is None else num_tokens
        return total / max(count, 1)
    per_seq, non_empty = [], 0
    for loss_row, mask_row in zip(loss, mask, strict=True):
        kept = [v for v, m in zip(loss_row, mask_row, strict=True) if m]
        non_empty += bool(kept)
        if mode == "seq-mean-token-mean":
            per_seq.append(sum(kept) / len(kept) if kept else 0.0)
        else:
            per_seq.append(sum(kept) / (norm_len or length))
    return sum(per_seq) / max(non_empty if num_seqs is None else num_seqs, 1)


def policy_loss(old, logp, adv, mask, lo, hi, c, mode="token-mean", num_tokens=None):
    """(loss, clip_fraction, dual_clip_fraction, approx_kl)."""
    old, logp, adv, mask = rows(old), rows(logp), rows(adv), rows(mask)
    losses, clipped_flags, dual_flags, kls = [], [], [], []
    for i in range(len(mask)):
        loss_row, clip_row, dual_row, kl_row = [], [], [], []
        for t in range(len(mask[i])):
            a = adv[i][t]
            log_ratio = min(max(logp[i][t] - old[i][t], -20.0), 20.0)
            r = math.exp(log_ratio)
            unclipped, clipped = -a * r, -a * min(max(r, 1 - lo), 1 + hi)
            loss = max(unclipped, clipped)
            dual = c is not None and a < 0 and loss > -a * c
            loss_row.append(-a * c if dual else loss)
            clip_row.append(float(clipped > unclipped))
            dual_row.append(float(dual))
            kl_row.append(-log_ratio)
        losses.append(loss_row)
        clipped_flags.append(clip_row)
        dual_flags.append(dual_row)
        kls.append(kl_row)
    return (
        aggregate(losses, mask, mode, num_tokens),
        masked_mean(clipped_flags, mask),
        masked_mean(dual_flags, mask),
        masked_mean(kls, mask),
    )


def value_loss(values, old, returns, mask, clip, mode="token-mean"):
    """(loss, clip_fraction)."""
    values, old, returns = rows(values), rows(old), rows(returns)
    losses, flags = [], []
    for i in range(len(values)):
        loss_row, flag_row = [], []
        for t in range(len(values[i])):
            v, o, ret = values[i][t], old[i][t], returns[i][t]
            v_clipped = min(max(v, o - clip), o + clip)
            plain, clipped = (v - ret) ** 2, (v_clipped - ret) ** 2
            loss_row.append(0.5 * max(plain, clipped))
            flag_row.append(float(clipped > plain))
        losses.append(loss_row)
        flags.append(flag_row)
    return aggregate(losses, mask, mode), masked_mean(flags, mask)


def grpo(rewards, mask, ids, eps=1e-6, norm_by_std=True) -> list[list[float]]:
    rewards, mask = rows(rewards), rows(mask)
    scores = [
        sum(r for r, m in zip(rr, mr, strict=True) if m)
        for rr, mr in zip(rewards, mask, strict=True)
    ]
    groups: dict = {}
    for i, group in enumerate(ids):
        groups.setdefault(group, []).append(scores[i])
    out = []
    for i, group in enumerate(ids):
        members = groups[group]
        mean = statistics.fmean(members) if len(members) > 1 else 0.0
        std = statistics.stdev(members) if len(members) > 1 else 1.0
        a = (scores[i] - mean) / (std + eps) if norm_by_std else scores[i] - mean
        out.append([a if m else 0.0 for m in mask[i]])
    return out


def gae(rewards, values, mask, gamma, lam) -> tuple[list[list[float]], list[list[float]]]:
    """(whitened advantages, returns); the recursion visits only the valid positions."""
    rewards, values, mask = rows(rewards), rows(values), rows(mask)
    advantages = [[0.0] * len(row) for row in mask]
    for i, mask_row in enumerate(mask):
        next_value = next_advantage = 0.0
        for t in [t for t in range(len(mask_row)) if mask_row[t]][::-1]:
            delta = rewards[i][t] + gamma * next_value - values[i][t]
            next_advantage = delta + gamma * lam * next_advantage
            next_value = values[i][t]
            advantages[i][t] = next_advantage
    returns = [
        [a + v if m else 0.0 for a, v, m in zip(ar, vr, mr, strict=True)]
        for ar, vr, mr in zip(advantages, values, mask, strict=True)
    ]
    flat = [
        a for ar, mr in zip(advantages, mask, strict=True) for a, m in zip(ar, mr, strict=True) if m
    ]
    mean = sum(flat) / len(flat) if flat else 0.0
    var = sum((a - mean) ** 2 for a in flat) / max(len(flat) - 1, 1)
    whitened = [
        [(a - mean) / math.sqrt(var + 1e-8) if m else 0.0 for a, m in zip(ar, mr, strict=True)]
        for ar, mr in zip(advantages, mask, strict=True)
    ]
    return whitened, returns


def filter_groups(rewards, ids, keep_singletons=True) -> list[bool]:
    groups: dict = {}
    for reward, group in zip(rows(rewards), ids, strict=True):
        groups.setdefault(group, []).append(reward)
    keep = []
    for group in ids:
        members = groups[group]
        singleton = len(members) == 1
        keep.append(any(r != members[0] for r in members) or (singleton and keep_singletons))
    return keep


def overlong(length: float, max_len: int, buffer: int, factor: float) -> float:
    if buffer == 0:
        return 0.0
    expected = max_len - buffer
    return 0.0 if length <= expected else -(length - expected) / buffer * factor
