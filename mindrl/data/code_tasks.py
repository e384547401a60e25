"""Small Python function tasks with their tests, for code RL on a real pretrained model.

Each prompt asks for one function by name and signature, described in a sentence; the
row's ``tests`` (its ``meta``) are assert statements over that function, as code-RL
datasets write them, which the built-in ``code_tests`` reward runs against the response's
program in the sandbox (mindrl/rewards/sandbox.py). The ``answer`` is a reference
solution: it passes its own tests (tests/data/test_tasks.py runs every kind), and nothing
scores a response by comparing it with it. Deterministic in the seed.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from mindrl.data.records import PromptRecord

#: The domain of every code task's rows (its route: reward.routes.code).
CODE_DOMAIN = "code"


@dataclass(frozen=True)
class CodeTask:
    """One task: the function's name and signature, what it does, a reference body, and
    the calls its tests make with their expected results."""

    name: str
    signature: str
    description: str
    solution: str
    cases: tuple[tuple[str, object], ...]

    def tests(self) -> list[str]:
        return [f"assert {self.name}({args}) == {expected!r}" for args, expected in self.cases]

    def reference(self) -> str:
        return f"def {self.name}{self.signature}:\n    {self.solution}\n"


def _add(rng: random.Random) -> CodeTask:
    k = rng.randint(2, 20)
    xs = rng.sample(range(-20, 50), 3)
    return CodeTask(
        f"add_{k}", "(x)", f"returns x plus {k}", f"return x + {k}",
        tuple((str(x), x + k) for x in xs),
    )  # fmt: skip


def _times(rng: random.Random) -> CodeTask:
    k = rng.randint(2, 9)
    xs = rng.sample(range(-10, 30), 3)
    return CodeTask(
        f"times_{k}", "(x)", f"returns x multiplied by {k}", f"return x * {k}",
        tuple((str(x), x * k) for x in xs),
    )  # fmt: skip


def _largest(rng: random.Random) -> CodeTask:
    lists = [rng.sample(range(-50, 50), rng.randint(2, 6)) for _ in range(3)]
    return CodeTask(
        "largest", "(numbers)", "returns the largest number of the list numbers",
        "return max(numbers)", tuple((repr(xs), max(xs)) for xs in lists),
    )  # fmt: skip


def _reverse(rng: random.Random) -> CodeTask:
    words = rng.sample(["apple", "stone", "river", "mindrl", "python", "cloud", "tea"], 3)
    return CodeTask(
        "reverse", "(text)", "returns the string text reversed", "return text[::-1]",
        tuple((repr(w), w[::-1]) for w in words),
    )  # fmt: skip


def _count_char(rng: random.Random) -> CodeTask:
    char = rng.choice("aeo")
    words = rng.sample(["banana", "cocoa", "teepee", "orange", "avocado", "echo"], 3)
    return CodeTask(
        f"count_{char}", "(text)", f"returns how many times the letter '{char}' occurs in text",
        f"return text.count('{char}')", tuple((repr(w), w.count(char)) for w in words),
    )  # fmt: skip


def _is_even(rng: random.Random) -> CodeTask:
    xs = rng.sample(range(-20, 40), 4)
    return CodeTask(
        "is_even", "(x)", "returns True when the integer x is even, else False",
        "return x % 2 == 0", tuple((str(x), x % 2 == 0) for x in xs),
    )  # fmt: skip


def _sum_list(rng: random.Random) -> CodeTask:
    lists = [rng.sample(range(-9, 30), rng.randint(1, 5)) for _ in range(3)]
    return CodeTask(
        "total", "(numbers)", "returns the sum of the list numbers", "return sum(numbers)",
        tuple((repr(xs), sum(xs)) for xs in lists),
    )  # fmt: skip


TASK_KINDS: tuple[Callable[[random.Random], CodeTask], ...] = (
    _add, _times, _largest, _reverse, _count_char, _is_even, _sum_list,
)  # fmt: skip


def code_prompt(task: CodeTask) -> str:
    return (
        f"Write a Python function `{task.name}{task.signature}` that {task.description}. "
        "Reply with the function in one ```python code block."
    )


def make_code_task(num_prompts: int, seed: int, name: str = "code") -> list[PromptRecord]:
    """``num_prompts`` function tasks, the same for the same seed; domain ``code``, the
    tests in each row's ``meta``."""
    rng = random.Random(f"{name}:{seed}")
    records = []
    for index in range(num_prompts):
        task = rng.choice(TASK_KINDS)(rng)
        records.append(
            PromptRecord(
                uid=f"{name}-{seed}-{index}",
                text=code_prompt(task),
                answer=task.reference(),
                domain=CODE_DOMAIN,
                meta={"tests": task.tests()},
            )
        )
    return records
