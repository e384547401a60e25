"""Environments the tests run (imported by the workers as ``tests.envs.toy_envs:<Class>``).

``Recall``: the first observation is a digit the policy must repeat in its next turn, so
a policy that ignores what the environment said is right one time in ten.
"""

from __future__ import annotations

import asyncio
import time

from mindrl.rewards import score_batch


class Recall:
    """Turn 1: anything, answered with a digit; turn 2: reward 1 for that digit, done."""

    def __init__(self, digit: int = 7, sleep_s: float = 0.0) -> None:
        self.digit, self.sleep_s, self.turn = str(digit), sleep_s, 0

    def reset(self, record) -> str:
        return record.text

    def step(self, action: str) -> tuple[str, float, bool]:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        self.turn += 1
        if self.turn == 1:
            return self.digit, 0.0, False
        return "", float(action.split()[:1] == [self.digit]), True


class AsyncRecall(Recall):
    """Recall with ``async def`` methods (awaited on the worker's event loop)."""

    async def reset(self, record) -> str:
        return record.text

    async def step(self, action: str) -> tuple[str, float, bool]:
        await asyncio.sleep(self.sleep_s)
        self.turn += 1
        if self.turn == 1:
            return self.digit, 0.0, False
        return "", float(action.split()[:1] == [self.digit]), True


class Talkative:
    """Never done: answers every turn with ``words`` (runs into max_turns or the context)."""

    def __init__(self, words: str = "1 2 3") -> None:
        self.words = words

    def reset(self, record) -> str:
        return record.text

    def step(self, action: str) -> tuple[str, float, bool]:
        return self.words, 0.25, False


class OneShot:
    """Scores the first turn with the synthetic verifier: a single-turn run's reward."""

    def reset(self, record) -> str:
        self.answer = record.answer
        return record.text

    def step(self, action: str) -> tuple[str, float, bool]:
        return "", float(score_batch([action], [self.answer])[0]), True


class Raises:
    """A step that raises: the run must end in one line naming this class and the prompt."""

    def reset(self, record) -> str:
        return record.text

    def step(self, action: str) -> tuple[str, float, bool]:
        raise ValueError("the tool crashed")


class Sleepy(Recall):
    """Recall whose steps take ``fast_s``, or ``slow_s`` on the episode of ``slow_uid``."""

    def __init__(self, slow_uid: str, slow_s: float, fast_s: float) -> None:
        super().__init__()
        self.slow_uid, self.slow_s, self.fast_s = slow_uid, slow_s, fast_s

    def reset(self, record) -> str:
        self.sleep_s = self.slow_s if record.uid == self.slow_uid else self.fast_s
        return record.text


class Restart:
    """Starts the episode with its own text instead of the record's prompt."""

    def reset(self, record) -> str:
        return "copy : 1 2 ="

    def step(self, action: str) -> tuple[str, float, bool]:
        return "", 1.0, True


class Gated:
    """Steps that wait, inside ``step``, until the test opens ``gate``; counts how many are
    inside at once (``peak``). Class-level state: one test at a time uses it."""

    gate: asyncio.Event | None = None
    inside = peak = 0

    def reset(self, record) -> str:
        return record.text

    async def step(self, action: str) -> tuple[str, float, bool]:
        cls = type(self)
        cls.inside += 1
        cls.peak = max(cls.peak, cls.inside)
        await cls.gate.wait()
        cls.inside -= 1
        return "", 1.0, True


class GatedOneAtATime(Gated):
    """:class:`Gated` whose worker runs one of its steps at a time."""

    max_concurrent_steps = 1


class StopsAtDigit:
    """One turn that ends at its first digit (``stop_strings``); reward 1 when the text it
    steps on ends with a digit, so the reward shows what ``step`` was given."""

    stop_strings = tuple("0123456789")

    def reset(self, record) -> str:
        return record.text

    def step(self, action: str) -> tuple[str, float, bool]:
        return "", float(action[-1:].isdigit()), True
