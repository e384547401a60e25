"""Validation metrics: the mean reward of held-out prompts and pass@k.

pass@k is the unbiased estimator of Chen et al. 2021 (arXiv:2107.03374, §2.1): with
``n`` responses to a prompt of which ``c`` pass, the chance that ``k`` of them drawn
without replacement hold at least one pass is ``1 - C(n - c, k) / C(n, k)``, averaged
over the prompts. Validation samples ``n = k`` responses, and then it is exactly the
share of prompts with at least one passing response.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import comb

VAL_PREFIX = "val/"


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that ``k`` of ``n`` responses, ``c`` of them passing, hold a pass.

    Raises:
        ValueError: not ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    return 1.0 - comb(n - c, k) / comb(n, k)


def validation_metrics(
    rewards: Sequence[float], passed: Sequence[bool] | None, n: int
) -> dict[str, float]:
    """``val/reward_mean`` of every response and, when ``n > 1`` and ``passed`` is known,
    ``val/pass@n``.

    ``rewards`` and ``passed`` hold ``n`` responses per prompt, prompt-major (prompt
    ``p``'s are ``[p*n : p*n + n]``). ``passed``: whether each response is right (the
    reward workers: every rule verifier gave it full credit); None when nothing judges
    right or wrong (a reward model alone).

    Raises:
        ValueError: no rewards, or a count that is not whole prompts.
    """
    if not rewards or len(rewards) % n:
        raise ValueError(f"validation needs whole groups of {n} rewards, got {len(rewards)}")
    metrics = {f"{VAL_PREFIX}reward_mean": sum(rewards) / len(rewards)}
    if n > 1 and passed is not None:
        counts = [sum(passed[i : i + n]) for i in range(0, len(passed), n)]
        metrics[f"{VAL_PREFIX}pass@{n}"] = sum(pass_at_k(n, c, n) for c in counts) / len(counts)
    return metrics
