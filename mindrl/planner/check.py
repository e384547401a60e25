"""The planner checked on every run: its per-device memory beside what the run measured.

At the end of a run the driver prints, for the stages the planner sizes (generation, if
the run generates, and the actor's update), the planned bytes per device and the largest
peak any actor worker reported in that stage over the whole run (``mindrl.metrics.memory``). On an
accelerator the measured figure is the device allocator's peak; on a CPU the "device" is
the host, so the figure is the worker's peak resident size, which also holds what the
planner leaves out (the Python / torch baseline, the engine's host copy; docs/memory.md).
A ratio far from 1 says the planner's model of this run is wrong, and by how much.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from mindrl.config import MindRLConfig
from mindrl.planner.memory import MemoryPlan
from mindrl.planner.report import plan_run_memory
from mindrl.run_plan import RunPlan

MIB = 2**20


@dataclass(frozen=True)
class StageCheck:
    """One stage's planned and measured bytes per device (measured: None if not seen)."""

    stage: str
    planned: int
    measured: int | None
    measured_as: str  # "device" (allocator peak) or "host" (resident size on a CPU)

    @property
    def ratio(self) -> float | None:
        return self.measured / self.planned if self.measured and self.planned else None


def planned_actor_bytes(memory: MemoryPlan, config: MindRLConfig, plan: RunPlan) -> dict[str, int]:
    """The actor worker's own bytes per stage; the other roles live in their own workers
    (collocated on the device, but each measures only itself). A run that generates
    nothing plans the update alone."""
    update = {"update": memory.training.total}
    if not plan.generates:
        return update
    generation = memory.generation_swap if config.rollout.swap else memory.generation_naive
    others = sum(memory.other_roles.values())
    if config.rollout.kv_cache_mib is not None:
        kv = int(config.rollout.kv_cache_mib * MIB)
    else:  # the engine takes what the fraction leaves
        kv = max(generation.kv_cache_budget, 0)
    return {"rollout": generation.total_without_kv - others + kv, **update}


def check_memory(
    config: MindRLConfig,
    plan: RunPlan,
    device_bytes: int,
    stage_peaks: Mapping[str, Mapping[str, float]],
    on_cpu: bool,
) -> list[StageCheck]:
    """Planned against measured for the generation (if ``plan`` generates) and update
    stages.

    ``stage_peaks``: stage name -> the largest ``device_peak_mib`` / ``host_peak_mib``
    over the run (``IterationRunner.stage_peaks``).
    """
    memory = plan_run_memory(config, plan, device_bytes)
    key, measured_as = ("host_peak_mib", "host") if on_cpu else ("device_peak_mib", "device")
    checks = []
    for stage, planned in planned_actor_bytes(memory, config, plan).items():
        peak = stage_peaks.get(stage, {}).get(key)
        measured = int(peak * MIB) if peak is not None else None
        checks.append(StageCheck(stage, planned, measured, measured_as))
    return checks


def format_memory_check(checks: list[StageCheck]) -> str:
    """``memory planned / measured per device ...: rollout 2.69G / 3.10G host (1.15x), ...``;
    empty when no planned stage was measured."""
    parts = []
    for check in checks:
        if check.measured is None:
            continue  # not measured: the run ended before the stage reported
        text = (
            f"{check.stage} {check.planned / 2**30:.2f}G / "
            f"{check.measured / 2**30:.2f}G {check.measured_as}"
        )
        if check.ratio is not None:
            text += f" ({check.ratio:.2f}x)"
        parts.append(text)
    if not parts:
        return ""
    return "memory planned / measured per device (actor, peak of the run): " + ", ".join(parts)
