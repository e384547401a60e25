"""Templated maths word problems with integer answers, for a real pretrained model.

Prompts are natural language ending in ``"Answer:"`` so a base or instruct model
(SmolLM2-135M) continues with the number; a few-shot header shows the format. The
problems are deterministic in the seed and every answer is a non-negative integer.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from mindrl.data.records import PromptRecord

NAMES = ("Tom", "Anna", "Ravi", "Mei", "Lucas", "Sara", "Omar", "Lena", "Kofi", "Yuki")
ITEMS = ("apples", "pencils", "marbles", "stickers", "books", "cookies", "coins", "shells")

# One worked example so a small pretrained model sees the "Answer: <number>" format.
FEW_SHOT_HEADER = (
    "Question: Ben has 4 cards. He gets 3 more cards. How many cards does Ben have now?\n"
    "Answer: 7\n\n"
)

Problem = tuple[str, int]
#: The domain of every word problem's rows (its route: reward.routes.math).
MATH_DOMAIN = "math"


def _addition(rng: random.Random, name: str, item: str) -> Problem:
    a, b = rng.randint(2, 50), rng.randint(2, 50)
    text = (
        f"{name} has {a} {item}. {name} buys {b} more {item}. How many {item} does {name} have now?"
    )
    return text, a + b


def _subtraction(rng: random.Random, name: str, item: str) -> Problem:
    a = rng.randint(10, 60)
    b = rng.randint(1, a - 1)
    text = f"{name} had {a} {item} and gave away {b}. How many {item} does {name} have left?"
    return text, a - b


def _multiplication(rng: random.Random, name: str, item: str) -> Problem:
    boxes, per_box = rng.randint(2, 9), rng.randint(2, 12)
    text = (
        f"{name} has {boxes} boxes with {per_box} {item} in each box. "
        f"How many {item} does {name} have in total?"
    )
    return text, boxes * per_box


def _division(rng: random.Random, name: str, item: str) -> Problem:
    friends, each = rng.randint(2, 8), rng.randint(2, 10)
    text = (
        f"{name} shares {friends * each} {item} equally among {friends} friends. "
        f"How many {item} does each friend get?"
    )
    return text, each


def _two_step(rng: random.Random, name: str, item: str) -> Problem:
    a, b = rng.randint(5, 30), rng.randint(2, 20)
    c = rng.randint(1, a + b - 1)
    text = (
        f"{name} has {a} {item}, finds {b} more, then loses {c}. "
        f"How many {item} does {name} have now?"
    )
    return text, a + b - c


PROBLEM_KINDS: tuple[Callable[[random.Random, str, str], Problem], ...] = (
    _addition,
    _subtraction,
    _multiplication,
    _division,
    _two_step,
)


def make_math_task(
    num_prompts: int, seed: int, name: str = "math", few_shot: bool = True
) -> list[PromptRecord]:
    """``num_prompts`` word problems, the same for the same seed.

    Args:
        num_prompts: How many problems.
        seed: Generator seed.
        name: Prefix of the prompt uids.
        few_shot: Put one worked example before each question.
    """
    rng = random.Random(f"{name}:{seed}")
    header = FEW_SHOT_HEADER if few_shot else ""
    records = []
    for index in range(num_prompts):
        kind = rng.choice(PROBLEM_KINDS)
        question, answer = kind(rng, rng.choice(NAMES), rng.choice(ITEMS))
        text = f"{header}Question: {question}\nAnswer:"
        uid = f"{name}-{seed}-{index}"
        records.append(PromptRecord(uid, text, str(answer), domain=MATH_DOMAIN))
    return records
