"""Independent float64 references for the algorithm maths: plain Python loops over
samples and tokens on nested lists (no torch), written from docs/architecture.md §6."""

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


def policy_loss(
    old, logp, adv, mask, lo, hi, c, mode="token-mean", num_tokens=None, behaviour=None, cap=None,
    norm_len=None,
):  # fmt: skip
    """(loss, clip_fraction, dual_clip_fraction, approx_kl); with ``behaviour`` log-probs
    each token's loss is weighted by min(exp(old - behaviour), cap) (decoupled PPO + TIS)."""
    old, logp, adv, mask = rows(old), rows(logp), rows(adv), rows(mask)
    behaviour = old if behaviour is None else rows(behaviour)
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
            weight = 1.0 if cap is None else tis_weight(old[i][t], behaviour[i][t], cap)
            loss_row.append(weight * (-a * c if dual else loss))
            clip_row.append(float(clipped > unclipped))
            dual_row.append(float(dual))
            kl_row.append(-log_ratio)
        losses.append(loss_row)
        clipped_flags.append(clip_row)
        dual_flags.append(dual_row)
        kls.append(kl_row)
    return (
        aggregate(losses, mask, mode, num_tokens, norm_len=norm_len),
        masked_mean(clipped_flags, mask),
        masked_mean(dual_flags, mask),
        masked_mean(kls, mask),
    )


def tis_weight(old: float, behaviour: float, cap: float) -> float:
    """pi_old / mu per token, truncated at ``cap``."""
    return min(math.exp(min(max(old - behaviour, -20.0), 20.0)), cap)


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


def rloo(rewards, mask, ids) -> list[list[float]]:
    """Leave-one-out: each score minus the mean of the others in its group (none: 0)."""
    rewards, mask = rows(rewards), rows(mask)
    scores = [
        sum(r for r, m in zip(rr, mr, strict=True) if m)
        for rr, mr in zip(rewards, mask, strict=True)
    ]
    out = []
    for i, group in enumerate(ids):
        others = [scores[j] for j, g in enumerate(ids) if g == group and j != i]
        baseline = sum(others) / len(others) if others else 0.0
        out.append([scores[i] - baseline if m else 0.0 for m in mask[i]])
    return out


def gspo_loss(old, logp, adv, mask, lo, hi) -> float:
    """Sequence ratio s_i = exp(mean_t(logp - old)); clipped per sequence; mean over the
    non-empty sequences (A_i read from the sequence's first valid token)."""
    old, logp, adv, mask = rows(old), rows(logp), rows(adv), rows(mask)
    losses = []
    for i in range(len(mask)):
        valid = [t for t in range(len(mask[i])) if mask[i][t]]
        if not valid:
            continue
        s = math.exp(sum(logp[i][t] - old[i][t] for t in valid) / len(valid))
        a = adv[i][valid[0]]
        losses.append(max(-a * s, -a * min(max(s, 1 - lo), 1 + hi)))
    return sum(losses) / max(len(losses), 1)


def reinforce_pp(rewards, old, ref_logp, mask, kl_coef, kind, gamma) -> list[list[float]]:
    """Shaped rewards r_t - kl_coef * KL_t, reward-to-go over the valid tokens, whitened
    over all valid tokens (unbiased variance, eps 1e-8 inside the root)."""
    rewards, old, ref_logp, mask = rows(rewards), rows(old), rows(ref_logp), rows(mask)
    returns = [[0.0] * len(row) for row in mask]
    for i, mask_row in enumerate(mask):
        to_go = 0.0
        for t in [t for t in range(len(mask_row)) if mask_row[t]][::-1]:
            shaped = rewards[i][t] - kl_coef * kl(old[i][t], ref_logp[i][t], kind)
            to_go = shaped + gamma * to_go
            returns[i][t] = to_go
    flat = [
        g for gr, mr in zip(returns, mask, strict=True) for g, m in zip(gr, mr, strict=True) if m
    ]
    mean = sum(flat) / len(flat)
    var = sum((g - mean) ** 2 for g in flat) / max(len(flat) - 1, 1)
    return [
        [(g - mean) / math.sqrt(var + 1e-8) if m else 0.0 for g, m in zip(gr, mr, strict=True)]
        for gr, mr in zip(returns, mask, strict=True)
    ]


def pf_filter(scores, ids, ratio, mode) -> list[bool]:
    """Per group of n: rank by score (ties by position), keep k = max(1, round(ratio n)):
    the top k (best), the bottom k (worst) or ceil(k/2) top + floor(k/2) bottom (both)."""
    scores = rows(scores)
    keep = [False] * len(scores)
    for group in dict.fromkeys(ids):
        members = [i for i, g in enumerate(ids) if g == group]
        ranked = sorted(members, key=lambda i: (scores[i], members.index(i)))
        k = max(1, round(ratio * len(members)))
        top = {"best": k, "worst": 0, "both": (k + 1) // 2}[mode]
        for i in ranked[len(ranked) - top :] + ranked[: k - top]:
            keep[i] = True
    return keep


def dpo(chosen, rejected, ref_chosen, ref_rejected, beta, loss_type) -> tuple[float, float]:
    """(mean loss, preference accuracy) over pairs of sequence log-probs."""
    losses, right = [], 0
    for c, r, rc, rr in zip(chosen, rejected, ref_chosen, ref_rejected, strict=True):
        h = (c - rc) - (r - rr)
        if loss_type == "sigmoid":
            losses.append(math.log1p(math.exp(-beta * h)))
        else:
            losses.append((h - 1 / (2 * beta)) ** 2)
        right += beta * (c - rc) > beta * (r - rr)
    return sum(losses) / len(losses), right / len(losses)
