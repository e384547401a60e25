"""Which roles wait on the host between their stages: the planner's fit check decides.

The reference and the critic share every training device with the actor in every mode
(mindrl/config/layout.py, ``RunLayout.device_processes``). Resident, they take device
memory from the actor's update and, collocated, from generation's KV cache through every
stage. When
the plan does not fit with them resident, the planner offloads them: their state (the
reference's weights; the critic's weights and optimizer state, its gradients being
released after each update) goes to pinned host memory after each of their stages and
comes back before the next (mindrl/workers/roles.py). The actor is never offloaded here:
its own allgather-swap already parks its training state during generation.
"""

from __future__ import annotations

import dataclasses

from mindrl.config import MindRLConfig
from mindrl.planner.report import fit_problems, plan_run_memory
from mindrl.run_plan import RunPlan

#: The roles that may be offloaded, in the order they are: the reference first (weights
#: only, and it runs once per iteration), then the critic (weights and optimizer state).
OFFLOADABLE = ("reference", "critic")


def plan_offload(
    config: MindRLConfig, plan: RunPlan, device_bytes: int, host_bytes: int, workspace: int = 0
) -> RunPlan:
    """``plan`` with the fewest roles offloaded (in :data:`OFFLOADABLE` order) that make
    every stage fit (``workspace``: each process's library workspace on the device).
    When no choice fits, the one with the fewest fit problems (fewer roles first):
    offloading cannot help a host that is already too small, and the fit check then
    reports what still does not fit."""
    candidates = [role for role in OFFLOADABLE if role in plan.model_roles]
    trials = []
    for count in range(len(candidates) + 1):
        trial = dataclasses.replace(plan, offloaded_roles=tuple(candidates[:count]))
        problems = fit_problems(
            plan_run_memory(config, trial, device_bytes, workspace), config, trial, host_bytes
        )
        if not problems:
            return trial
        trials.append((len(problems), count, trial))
    return min(trials, key=lambda t: t[:2])[2]
