"""Algorithms by name: ``get_algorithm("grpo")``; an unknown name lists the known ones."""

from __future__ import annotations

from mindrl.algorithm import Algorithm
from trainers.dapo import DAPO
from trainers.dpo import DPO
from trainers.dr_grpo import DrGRPO
from trainers.grpo import GRPO
from trainers.gspo import GSPO
from trainers.pf_ppo import PFPPO
from trainers.ppo import PPO
from trainers.reinforce_pp import ReinforcePP
from trainers.rloo import RLOO

ALGORITHMS: dict[str, type[Algorithm]] = {
    cls.name: cls for cls in (GRPO, PPO, DAPO, PFPPO, ReinforcePP, RLOO, GSPO, DrGRPO, DPO)
}


def get_algorithm(name: str) -> Algorithm:
    """The algorithm called ``name`` (one of :data:`ALGORITHMS`).

    Raises:
        ValueError: no algorithm has that name; the message lists the known ones.
    """
    try:
        return ALGORITHMS[name]()
    except KeyError:
        raise ValueError(f"unknown algorithm '{name}'; known: {', '.join(ALGORITHMS)}") from None
