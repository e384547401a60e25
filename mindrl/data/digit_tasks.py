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
    """

    operation: str
    min_digits: int
    max_digits: int

    def __post_init__(self) -> None:
        if self.operation not in OPERATIONS:
            raise ValueError(f"digit task operation {self.operation!r}; known: {OPERATIONS}")
        if not 1 <= self.min_digits <= self.max_digits:
            raise ValueError(
                f"digit task needs 1 <= min_digits <= max_digits, got "
                f"{self.min_digits}..{self.max_digits}"
            )


# Difficulties, easiest first. The answer length is what makes them harder for GRPO
# from random init: 1 token for `next`, 1-2 for `copy`, 2-3 for `reverse`.
DIGIT_TASKS: dict[str, DigitTaskSpec] = {
    "tiny-next": DigitTaskSpec("next", min_digits=1, max_digits=3),
    "tiny-copy": DigitTaskSpec("copy", min_digits=1, max_digits=2),
    "tiny-reverse": DigitTaskSpec("reverse", min_digits=2, max_digits=3),
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
        length = rng.randint(spec.min_digits, spec.max_digits)
        digits = [rng.randrange(10) for _ in range(length)]
        prompt = " ".join([spec.operation, *map(str, digits), "="])
        answer = " ".join(map(str, digit_answer(spec.operation, digits)))
        records.append(PromptRecord(uid=f"{name}-{seed}-{index}", text=prompt, answer=answer))
    return records
