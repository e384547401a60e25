"""Synthetic digit tasks for the CPU default: tiny, verifiable, conditional on the prompt.

A prompt reads ``"<op> d1 d2 ... ="`` and the answer is a short digit string, e.g.
``"next 3 1 4 ="`` -> ``"5"``, ``"copy 3 1 ="`` -> ``"3 1"``, ``"reverse 3 1 4 ="`` ->
``"4 1 3"``. Every word is a single token of the built-in tiny tokenizer, so responses
are 1-4 tokens plus an eos. Generation is deterministic in the seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from mindrl.data.records import PromptRecord

OPERATIONS = ("next", "copy", "reverse")


@dataclass(frozen=True)
class DigitTaskSpec:
    """One difficulty of the digit task.

    Attributes:
        operation: ``next`` (the digit after the last prompt digit, mod 10: 1 answer
            token), ``copy`` (repeat the digits) or ``reverse`` (digits backwards).
        min_digits: Fewest digits in a prompt.
        max_digits: Most digits in a prompt.
        long_share: Share of prompts that ask for a long answer instead (a long tail
            of response lengths, what partial rollout is for); 0: none.
        long_digits: Digits of such a long prompt.
    """

    operation: str
    min_digits: int
    max_digits: int
    long_share: float = 0.0
    long_digits: int = 0

    def __post_init__(self) -> None:
        if self.operation not in OPERATIONS:
            raise ValueError(f"digit task operation {self.operation!r}; known: {OPERATIONS}")
        if not 1 <= self.min_digits <= self.max_digits:
            raise ValueError(
                f"digit task needs 1 <= min_digits <= max_digits, got "
                f"{self.min_digits}..{self.max_digits}"
            )
        if not 0 <= self.long_share <= 1 or (self.long_share and self.long_digits < 1):
            raise ValueError(
                f"digit task needs 0 <= long_share <= 1 and long_digits >= 1 with a long "
                f"share, got {self.long_share}, {self.long_digits}"
            )


# Difficulties, easiest first. The answer length is what makes them harder for GRPO
# from random init: 1 token for `next`, 1-2 for `copy`, 2-3 for `reverse`.
DIGIT_TASKS: dict[str, DigitTaskSpec] = {
    "tiny-next": DigitTaskSpec("next", min_digits=1, max_digits=3),
    "tiny-copy": DigitTaskSpec("copy", min_digits=1, max_digits=2),
    "tiny-reverse": DigitTaskSpec("reverse", min_digits=2, max_digits=3),
    # Long-tailed response lengths: 1 prompt in 8 asks to copy 12 digits (13 response
    # tokens with eos), the rest 1-2 (2-3 tokens). Prompts fit max_prompt_length 16.
    "longtail": DigitTaskSpec("copy", min_digits=1, max_digits=2, long_share=0.125, long_digits=12),
    # A longer tail for timing partial rollout: 1 in 8 copies 48 digits (49 tokens); needs
    # rollout.max_prompt_length 64 and max_response_length >= 49.
    "longtail-48": DigitTaskSpec(
        "copy", min_digits=1, max_digits=2, long_share=0.125, long_digits=48
    ),
}
DEFAULT_TINY_TASK = "tiny-next"


def digit_answer(operation: str, digits: list[int]) -> list[int]:
    """The answer digits of ``operation`` applied to the prompt ``digits``."""
    if operation == "next":
        return [(digits[-1] + 1) % 10]
    if operation == "copy":
        return list(digits)
    if operation == "reverse":
        return digits[::-1]
    raise ValueError(f"digit task operation {operation!r}; known: {OPERATIONS}")


def make_digit_task(
    spec: DigitTaskSpec, num_prompts: int, seed: int, name: str = "digits"
) -> list[PromptRecord]:
    """``num_prompts`` prompts of the digit task ``spec``, the same for the same seed."""
    rng = random.Random(f"{name}:{seed}")
    records = []
    for index in range(num_prompts):
        length = _prompt_digits(spec, rng)
        digits = [rng.randrange(10) for _ in range(length)]
        prompt = " ".join([spec.operation, *map(str, digits), "="])
        answer = " ".join(map(str, digit_answer(spec.operation, digits)))
        records.append(PromptRecord(uid=f"{name}-{seed}-{index}", text=prompt, answer=answer))
    return records


def _prompt_digits(spec: DigitTaskSpec, rng: random.Random) -> int:
    """How many digits the next prompt has; a task without a long tail draws exactly as
    before it had one, so its prompts are unchanged."""
    if spec.long_share and rng.random() < spec.long_share:
        return spec.long_digits
    return rng.randint(spec.min_digits, spec.max_digits)
