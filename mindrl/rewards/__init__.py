"""Rule-based rewards on CPU: digit-task partial credit, exact match, math-verify."""

from mindrl.rewards.digits import digit_partial_reward, exact_match_reward
from mindrl.rewards.maths import extract_final_answer, math_format_reward, math_reward
from mindrl.rewards.registry import (
    VERIFIERS,
    decode_responses,
    get_verifier,
    register_verifier,
    score_batch,
)

__all__ = [
    "VERIFIERS",
    "decode_responses",
    "digit_partial_reward",
    "exact_match_reward",
    "extract_final_answer",
    "get_verifier",
    "math_format_reward",
    "math_reward",
    "register_verifier",
    "score_batch",
]
