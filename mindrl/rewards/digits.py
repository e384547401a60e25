"""Verifiers of the synthetic digit tasks: exact match and position-wise partial credit."""

from __future__ import annotations

import re

# A digit is one symbol ("314" -> 3, 1, 4); any other run of non-space characters (an
# "<unk>", a word) is one wrong symbol, so garbage costs one position per token.
SYMBOL = re.compile(r"\d|[^\d\s]+")


def _symbols(text: str) -> list[str]:
    return SYMBOL.findall(text)


def digit_partial_reward(response: str, ground_truth: str) -> float:
    """Share of answer positions right, over the longer of answer and response.

    ``"3 1"`` vs truth ``"3 1"`` -> 1.0; ``"3 2"`` -> 0.5; ``"3 1 7"`` -> 2/3 (an extra
    token costs, so stopping with eos on time is learned); empty -> 0.0.
    """
    predicted, expected = _symbols(response), _symbols(ground_truth)
    if not predicted or not expected:
        return 0.0
    right = sum(p == e for p, e in zip(predicted, expected, strict=False))
    return right / max(len(predicted), len(expected))


def exact_match_reward(response: str, ground_truth: str) -> float:
    """1.0 when response and truth hold the same symbols (whitespace ignored), else 0.0."""
    return float(_symbols(response) == _symbols(ground_truth))
