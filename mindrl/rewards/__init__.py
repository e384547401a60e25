"""Rewards: the built-in rules (digit-task partial credit, exact match, math-verify), the
functions a user names in the config, the process pool they run in, the code sandbox and
the LLM judge.

Lazy (PEP 562): a reward pool process imports a user's function through this package, and
starting one should cost a fork, not torch's import, which only the batch scoring of
``registry`` needs.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "VERIFIERS": "mindrl.rewards.registry",
    "decode_responses": "mindrl.rewards.registry",
    "get_verifier": "mindrl.rewards.registry",
    "register_verifier": "mindrl.rewards.registry",
    "score_batch": "mindrl.rewards.registry",
    "digit_partial_reward": "mindrl.rewards.digits",
    "exact_match_reward": "mindrl.rewards.digits",
    "extract_final_answer": "mindrl.rewards.maths",
    "math_format_reward": "mindrl.rewards.maths",
    "math_reward": "mindrl.rewards.maths",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mindrl.rewards' has no attribute '{name}'")
    return getattr(importlib.import_module(module), name)
