"""Algorithms by name."""

from __future__ import annotations

from trainers.base import Algorithm
from trainers.dapo import DAPO
from trainers.grpo import GRPO
from trainers.ppo import PPO

ALGORITHMS: dict[str, type[Algorithm]] = {"grpo": GRPO, "ppo": PPO, "dapo": DAPO}


def get_algorithm(name: str) -> Algorithm:
    """The algorithm called ``name``; an unknown name lists the known ones."""
    try:
        return ALGORITHMS[name]()
    except KeyError:
        raise ValueError(f"unknown trainer '{name}'; known: {', '.join(ALGORITHMS)}") from None
