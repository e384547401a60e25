"""What a reward function is given and what becomes of its answer.

A user's reward function takes one :class:`RewardInput` (its keyword arguments are the
config's ``kwargs``) and returns a float, ``None`` (it abstains: the sample is not its
kind) or a dict ``{"score": float, ...named components}``. Every call ends as one
:class:`RewardOutcome` with a status; the reward stage combines the outcomes of a
sample's route and the run's failure policy decides what a failed sample does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

#: How a call ended: a usable score, an abstention, an exception (or a dead process), past
#: its time limit, or an answer that is not a score (NaN, inf, a wrong type or length).
OK, ABSTAIN, ERROR, TIMEOUT, INVALID = "ok", "abstain", "error", "timeout", "invalid"
STATUSES = (OK, ABSTAIN, ERROR, TIMEOUT, INVALID)
#: The statuses that count as a failure of the function (an abstention is not one).
FAILURES = (ERROR, TIMEOUT, INVALID)


class InvalidAnswer(ValueError):
    """Raised by a reward function whose own answer is not a score (an LLM judge's reply
    without a verdict, a parse that failed): the sample's outcome is ``invalid`` with the
    message as its error, never a number and never counted as the function crashing."""


@dataclass(frozen=True)
class RewardInput:
    """One sample as a reward function sees it.

    Attributes:
        uid: the prompt's stable identity (its row in the data: ``file.jsonl#12``).
        prompt: the row's prompt text, before any template.
        response: the response text, cut at the end-of-sequence token.
        answer: the row's ground truth, as text.
        domain: the row's domain (``data.domain_key``; ``default`` when the row has none).
        meta: every other field of the data row (tests of a code task, a rubric, ...).
    """

    uid: str
    prompt: str
    response: str
    answer: str
    domain: str = "default"
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, record: Any, response: str) -> RewardInput:
        """The input of ``response`` to the prompt of ``record`` (a
        :class:`~mindrl.data.records.PromptRecord`)."""
        meta = dict(record.meta)
        return cls(record.uid, record.prompt, response, record.answer, record.domain, meta)


@dataclass(frozen=True)
class RewardOutcome:
    """How one call for one sample ended.

    Attributes:
        status: one of :data:`STATUSES`.
        score: the score (``ok`` only; None otherwise).
        components: named figures a dict answer carried besides ``score``.
        error: why it failed, one line (the first line of the exception, the timeout, what
            the answer was instead of a score); empty on ``ok`` and ``abstain``.
        latency_s: wall seconds of the call (for a group call: the group's, on each sample).
    """

    status: str
    score: float | None = None
    components: dict[str, float] = field(default_factory=dict)
    error: str = ""
    latency_s: float = 0.0

    @property
    def failed(self) -> bool:
        return self.status in FAILURES


def outcome_of(answer: Any, name: str, latency_s: float = 0.0) -> RewardOutcome:
    """A function's answer for one sample as an outcome: ``ok`` with its score, ``abstain``
    for None, ``invalid`` (naming the function ``name``) for anything that is not a finite
    number or a dict with a finite ``score`` and numeric components."""
    if answer is None:
        return RewardOutcome(ABSTAIN, latency_s=latency_s)
    components: dict[str, float] = {}
    score = answer
    if isinstance(answer, dict):
        if "score" not in answer:
            keys = ", ".join(map(str, answer)) or "none"
            return _invalid(name, f"a dict without 'score' (keys: {keys})", latency_s)
        score = answer["score"]
        for key, value in answer.items():
            if key == "score":
                continue
            if not _is_number(value) or not math.isfinite(float(value)):
                return _invalid(name, f"component {key!r} is {_shown(value)}", latency_s)
            components[str(key)] = float(value)
    if score is None and isinstance(answer, dict):
        return RewardOutcome(ABSTAIN, latency_s=latency_s)
    if not _is_number(score):
        return _invalid(name, f"{_shown(score)} instead of a number", latency_s)
    if not math.isfinite(float(score)):
        return _invalid(name, f"a score of {float(score)}", latency_s)
    return RewardOutcome(OK, float(score), components, latency_s=latency_s)


def _is_number(value: Any) -> bool:
    """An int or float (a numpy scalar included), finite or not; never a bool: True as a
    reward is a bug in the function, not a 1."""
    if hasattr(value, "item") and getattr(value, "shape", None) == ():
        value = value.item()  # a numpy scalar as the Python number it holds
    return isinstance(value, int | float) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}" if len(text) <= 60 else f"{type(value).__name__}"


def _invalid(name: str, what: str, latency_s: float) -> RewardOutcome:
    return RewardOutcome(INVALID, error=f"{name} returned {what}", latency_s=latency_s)
