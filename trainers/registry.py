"""Algorithms by name: ``get_algorithm("grpo")``; an unknown name lists the known ones."""

from __future__ import annotations

from mindrl.algorithm import Algorithm
from trainers.dapo import DAPO
from trainers.grpo import GRPO
from trainers.ppo import PPO

ALGORITHMS: dict[str, type[Algorithm]] = {cls.name: cls for cls in (GRPO, PPO, DAPO)}


def get_algorithm(name: str) -> Algorithm:
    """The algorithm called ``name`` (``grpo``, ``ppo`` or ``dapo``).

    Raises:
        ValueError: no algorithm has that name; the message lists the known ones.
    """
    try:
        return ALGORITHMS[name]()
    except KeyError:
        raise ValueError(f"unknown algorithm '{name}'; known: {', '.join(ALGORITHMS)}") from None
