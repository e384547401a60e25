"""The built-in ``code_tests`` reward: the response's program against the row's tests.

The program is the response's last ```` ```python ```` block (else its last fenced block,
else the whole response); the tests are the row's ``tests`` field: Python statements, one
test each (asserts, as code-RL datasets write them), a list of strings or one string of
statements. Both run in :mod:`mindrl.rewards.sandbox`, never in this process: the verdict
is the sandbox's, computed outside the program's reach. A sandbox that cannot run raises
(the call counts as an error), so a broken install never scores as a wrong program.
"""

from __future__ import annotations

import re
from typing import Any

from mindrl.rewards.inputs import RewardInput
from mindrl.rewards.sandbox import SandboxLimits, run_sandboxed, split_tests

#: A fenced block: its info string (```python) and body. The closing fence may be missing
#: when the response was cut at the length limit; the block then runs to the end.
FENCE = re.compile(r"```[ \t]*([\w+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
PYTHON_TAGS = ("python", "python3", "py")


def code_tests(
    inp: RewardInput, *, timeout_s: float = 10, memory_mb: int = 512, disk_mb: int = 64
) -> dict[str, float] | None:
    """1.0 when the program passes every test of the row, else 0.0, with the share of tests
    passed; None (abstain) when the row has no tests.

    Raises:
        SandboxUnavailable: the sandbox cannot run here (bwrap missing, namespaces off).
        ValueError: the row's tests are neither Python statements nor a list of them.
    """
    tests = _tests_of(inp.meta.get("tests"))
    if not tests:
        return None
    limits = SandboxLimits(timeout_s=timeout_s, memory_mb=memory_mb, disk_mb=disk_mb)
    result = run_sandboxed(extract_program(inp.response), tests, limits)
    passed = result.tests_passed or 0
    return {"score": 1.0 if result.passed else 0.0, "tests_passed_frac": passed / len(tests)}


def _tests_of(raw: Any) -> list[str]:
    if raw is None:
        return []
    if isinstance(raw, str):
        return split_tests(raw) if raw.strip() else []
    if isinstance(raw, list | tuple):
        kept = [test for test in raw if not isinstance(test, str) or test.strip()]
        return split_tests(kept)
    raise ValueError(
        f"meta['tests'] must be a string or a list of strings, got {type(raw).__name__}"
    )


def extract_program(response: str) -> str:
    """The program in ``response``: its last python block, else its last fenced block of
    any language, else the whole response."""
    blocks = [(tag.lower(), body) for tag, body in FENCE.findall(response) if body.strip()]
    for wanted in (lambda tag: tag in PYTHON_TAGS, lambda tag: True):
        chosen = [body for tag, body in blocks if wanted(tag)]
        if chosen:
            return chosen[-1]
    return response
