"""Maths answers checked with ``math-verify``: the final answer against the ground truth.

The final answer is the ``\\boxed{}`` content when there is one, else the text after the
last ``Answer:``, else the response's first non-empty line (the prompt already ended in
``Answer:``). math-verify guards parsing with ``signal.alarm``, which only works on a
process's main thread; elsewhere (threaded Ray actors, thread pools) timeouts are off.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Any

ANSWER_MARK = re.compile(r"answer\s*[:：]", re.IGNORECASE)
TIMEOUT_S = 5


def signal_timeouts_allowed() -> bool:
    """Whether math-verify may use its SIGALRM timeouts here (POSIX main thread only)."""
    return os.name == "posix" and threading.current_thread() is threading.main_thread()


def extract_final_answer(response: str) -> str:
    """The part of ``response`` that holds the final answer (may be empty)."""
    if "\\boxed" in response:
        return response  # math-verify's LaTeX extraction prefers \boxed{} itself
    marks = list(ANSWER_MARK.finditer(response))
    tail = response[marks[-1].end() :] if marks else response
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[0] if lines else ""


def parse_answer(text: str) -> list[Any]:
    """math-verify's parse of ``text`` ([] when nothing parses), timeout-safe in any thread."""
    from math_verify import parse

    timeout = TIMEOUT_S if signal_timeouts_allowed() else None
    return parse(text, parsing_timeout=timeout)


def math_reward(response: str, ground_truth: str) -> float:
    """1.0 when the response's final answer equals the ground truth mathematically."""
    from math_verify import verify

    predicted = parse_answer(extract_final_answer(response))
    expected = parse_answer(ground_truth)
    if not predicted or not expected:
        return 0.0
    timeout = TIMEOUT_S if signal_timeouts_allowed() else None
    return float(verify(expected, predicted, timeout_seconds=timeout))


def math_format_reward(response: str, ground_truth: str) -> float:
    """1.0 when the response states a parseable final answer (right or wrong), else 0.0."""
    del ground_truth  # format only
    return float(bool(parse_answer(extract_final_answer(response))))
