"""Reward functions as a user writes them, imported by the reward workers of the tests'
runs from PYTHONPATH (tests.rewards.user_rewards:<name>)."""

from __future__ import annotations

from mindrl.rewards.inputs import RewardInput


def says_the_answer(inp: RewardInput, bonus: float = 0.0) -> float:
    """1 + bonus when the response holds the answer's digit; fails on the prompts whose
    row says so (a reward that raises must not end the run)."""
    if inp.meta.get("breaks"):
        raise RuntimeError(f"cannot score {inp.uid}")
    return (1.0 + bonus) if inp.answer in inp.response else 0.0
