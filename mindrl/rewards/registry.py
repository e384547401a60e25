"""Verifiers by name, and scoring a batch of responses into sequence rewards."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from mindrl.rewards.digits import digit_partial_reward, exact_match_reward
from mindrl.rewards.maths import math_format_reward, math_reward

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Verifier = Callable[[str, str], float]

VERIFIERS: dict[str, Verifier] = {
    "synthetic": digit_partial_reward,
    "exact": exact_match_reward,
    "math": math_reward,
    "math_format": math_format_reward,
}


def register_verifier(name: str, verifier: Verifier) -> None:
    """Make ``verifier(response, ground_truth) -> float`` available under ``name``."""
    if name in VERIFIERS:
        raise ValueError(f"verifier {name!r} is already registered")
    VERIFIERS[name] = verifier


def get_verifier(name: str) -> Verifier:
    """The verifier called ``name``.

    Raises:
        KeyError: unknown name; the message lists the known ones.
    """
    if name not in VERIFIERS:
        raise KeyError(f"unknown verifier {name!r}; known: {', '.join(sorted(VERIFIERS))}")
    return VERIFIERS[name]


def decode_responses(
    response_ids: Sequence[Sequence[int]], tokenizer: PreTrainedTokenizerBase
) -> list[str]:
    """Response texts: cut at the first eos; every token before it is kept.

    Give each response as generated (padding only after its eos). Special tokens the
    policy generated before eos (``<pad>``, ``<s>``) stay in the text as wrong symbols,
    and ids the tokenizer does not know (a model's padded vocabulary is larger) become
    ``<unk>``: dropping either would let garbage through the verifier unseen.
    """
    eos, unk = tokenizer.eos_token_id, tokenizer.unk_token_id
    vocab_size = len(tokenizer)
    texts = []
    for ids in response_ids:
        ids = [int(i) for i in ids]
        if eos in ids:
            ids = ids[: ids.index(eos)]
        ids = [i if 0 <= i < vocab_size else unk for i in ids]
        texts.append(tokenizer.decode(ids))
    return texts


def score_batch(
    responses: Sequence[str] | Sequence[Sequence[int]],
    ground_truths: Sequence[str],
    verifiers: Sequence[str] = ("synthetic",),
    weights: Mapping[str, float] | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> torch.Tensor:
    """Sequence rewards of a batch: the weighted sum of the named verifiers.

    Args:
        responses: Response texts, or response token ids (then ``tokenizer`` is needed).
        ground_truths: Truth of each response, same length.
        verifiers: Verifier names summed into the reward.
        weights: Per-verifier weight (default 1.0 each).
        tokenizer: Decodes token-id responses.

    Returns:
        float32 tensor of shape [batch].

    Raises:
        ValueError: lengths differ, or ids given without a tokenizer.
        KeyError: unknown verifier name.
    """
    if len(responses) != len(ground_truths):
        raise ValueError(f"{len(responses)} responses but {len(ground_truths)} ground truths")
    texts = _as_texts(responses, tokenizer)
    weights = weights or {}
    named = [(get_verifier(name), float(weights.get(name, 1.0))) for name in verifiers]
    rewards = [
        sum(weight * verifier(text, truth) for verifier, weight in named)
        for text, truth in zip(texts, ground_truths, strict=True)
    ]
    return torch.tensor(rewards, dtype=torch.float32)


def _as_texts(
    responses: Sequence[str] | Sequence[Sequence[int]], tokenizer: PreTrainedTokenizerBase | None
) -> list[str]:
    if all(isinstance(response, str) for response in responses):
        return list(responses)  # type: ignore[arg-type]
    if tokenizer is None:
        raise ValueError("responses are token ids: pass the tokenizer to decode them")
    return decode_responses(responses, tokenizer)  # type: ignore[arg-type]
