"""A reward function that takes a fixed time per sample, as a slow verifier or a remote
scorer does: what benchmarks/reward.py measures the reward stage with. Its score is the
tiny task's own (the digit verifier), so runs with it learn as the recipe does."""

from __future__ import annotations

import time

from mindrl.rewards.digits import digit_partial_reward
from mindrl.rewards.inputs import RewardInput


def slow_digits(inp: RewardInput, seconds: float = 0.5) -> float:
    """The digit task's partial credit, after ``seconds`` of waiting."""
    time.sleep(seconds)
    return digit_partial_reward(inp.response, inp.answer)
