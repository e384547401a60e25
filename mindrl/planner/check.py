"""The planner checked on every run: its memory per worker beside what the run measured.

At the end of a run the driver prints, for the stages the planner sizes (generation, if
the run generates, and the actor's update), the planned bytes and the largest peak any
actor worker reported in that stage over the whole run (``mindrl.metrics.memory``). A
ratio far from 1 says the planner's model of this run is wrong, and by how much.

On an accelerator both sides are device bytes: the planner's per-device figures against
the device allocator's peak. On a CPU the "device" is the host, so the honest measured
figure is the worker's peak resident size (host RSS), and the planned side becomes what
a CPU worker holds (:func:`cpu_worker_bytes`): the planner's own terms plus those a
device plan leaves out, each taken from docs/memory.md's accounting of a SmolLM2 actor
rank. The CPU ledger (``device_peak_mib``) is no substitute: it sees only the tensors
declared to it (training weights and resharding buffers), not the optimizer state,
gradients, activations, the engine's weights or the KV cache that the planner sizes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mindrl.config import MindRLConfig
from mindrl.config.layout import DISAGGREGATED, rollout_worker_spans_devices
from mindrl.planner.memory import (
    MemoryPlan,
    gather_bucket_bytes,
    rollout_device_peak,
    rollout_worker_peak,
)
from mindrl.planner.report import plan_run_memory
from mindrl.run_plan import RunPlan

MIB = 2**20

#: Resident size of a CPU worker process that holds no model yet: Python, torch,
#: Megatron-core, transformers, gloo and Ray's worker runtime. Measured on the 2-core box
#: (2026-11-25): a fresh Ray actor is 79 MiB, 374 MiB once it has imported
#: ``mindrl.workers.roles`` (the ModelWorker's module), and 439 MiB after a gloo group
#: and a first HF ``generate``, forward, backward and AdamW step on a 1.3 MB model (the
#: kernels' and thread pool's first-use memory); docs/memory.md.
CPU_WORKER_BASELINE_BYTES = 439 * MIB
#: How far a stage's measured device peak may be from the plan and still match it.
DEVICE_TOLERANCE = 0.15
#: The end-of-run check's figures in a run's folder (:func:`write_memory_check`).
MEMORY_CHECK_FILE = "memory_check.json"


@dataclass(frozen=True)
class StageCheck:
    """One stage's planned and measured bytes (measured: None if not seen)."""

    stage: str
    planned: int
    measured: int | None
    measured_as: str  # "device" (allocator peak) or "host RSS" (resident size on a CPU)

    @property
    def ratio(self) -> float | None:
        return self.measured / self.planned if self.measured and self.planned else None

    @property
    def within_tolerance(self) -> bool | None:
        """Device bytes within :data:`DEVICE_TOLERANCE` of the plan (None: host RSS, whose
        comparison is looser, or nothing measured)."""
        if self.ratio is None or self.measured_as != "device":
            return None
        return abs(self.ratio - 1) <= DEVICE_TOLERANCE


def rollout_measured(config: MindRLConfig, plan: RunPlan) -> bool:
    """Whether the rollout stage's memory is measured where the planner sizes it: not
    when nothing generates, nor when a rollout worker's engine runs its TP ranks in
    processes of its own (disaggregated, ``rollout.tp > 1``: vLLM's ``mp`` workers hold
    the weights and the KV cache, the measured worker only the received copy)."""
    return plan.has_generation_engine and not rollout_worker_spans_devices(config)


def planned_actor_bytes(memory: MemoryPlan, config: MindRLConfig, plan: RunPlan) -> dict[str, int]:
    """The actor worker's own device bytes per stage; the other roles live in their own
    workers (collocated on the device, but each measures only itself). A run that
    generates nothing plans the update alone; disaggregated, the rollout stage is a
    rollout worker's (:func:`~mindrl.planner.memory.rollout_worker_peak`)."""
    update = {"update": memory.update_stage}
    if not rollout_measured(config, plan):
        return update
    if plan.mode == DISAGGREGATED:
        return {"rollout": rollout_device_peak(config, memory), **update}
    return {"rollout": memory.rollout_peak, **update}


def cpu_worker_bytes(memory: MemoryPlan, config: MindRLConfig, plan: RunPlan) -> dict[str, int]:
    """The peak resident size of a CPU actor worker per stage, from the planner's terms.

    On a CPU nothing leaves the process: what a device plan swaps to the host or puts to
    sleep stays in the same RAM. So, beside :data:`CPU_WORKER_BASELINE_BYTES`:

    * the training state between stages is the weights and optimizer state; gradients
      exist in the update only (``ModelWorker.update`` releases them after every step,
      so neither generation nor the swap holds them);
    * the generation engine's own weights (one generation shard) stay resident through
      the update: sleeping has nowhere to move them to;
    * with ``rollout.swap`` the pinned host buffers (weights, + optimizer state with
      ``actor.swap_optimizer``), allocated at the first reshard, are kept: a second copy
      of what they swap;
    * while resharding, the resharder's generation buffers (one shard) live until the
      engine has copied them, beside the bucket being all-gathered
      (:func:`gather_bucket_bytes`); the engine's working memory comes after they are
      freed, so the rollout peak holds the larger of the two.

    Disaggregated, the actor's workers train only (no engine, nothing swapped) and the
    rollout stage is the rollout workers' (:func:`~mindrl.planner.memory.rollout_worker_peak`:
    the engine's weights, the weights it receives and its working memory).
    """
    training, baseline = memory.training, CPU_WORKER_BASELINE_BYTES
    if not rollout_measured(config, plan):
        return {"update": baseline + training.total}
    shard = memory.generation_naive.shard
    if plan.mode == DISAGGREGATED:
        rollout = baseline + rollout_worker_peak(config, memory.device_bytes)
        return {"rollout": rollout, "update": baseline + training.total}
    working = memory.generation_naive.working
    swap_buffers = memory.swap_bytes if config.rollout.swap else 0
    held = baseline + shard + swap_buffers  # both stages, besides the training state
    resharding = shard + gather_bucket_bytes(config, training)
    return {
        "rollout": held + training.resident + max(resharding, working),
        "update": held + training.total,
    }


def check_memory(
    config: MindRLConfig,
    plan: RunPlan,
    device_bytes: int,
    stage_peaks: Mapping[str, Mapping[str, float]],
    on_cpu: bool,
    workspace: int = 0,
) -> list[StageCheck]:
    """Planned against measured for the generation (if ``plan`` generates) and update
    stages: device bytes on an accelerator, the worker's resident size ``on_cpu``;
    ``workspace``: each process's library workspace on the device.

    ``stage_peaks``: stage name -> the largest ``device_peak_mib`` / ``host_peak_mib``
    over the run (``IterationRunner.stage_peaks``).
    """
    memory = plan_run_memory(config, plan, device_bytes, workspace)
    if on_cpu:
        key, measured_as, planned = "host_peak_mib", "host RSS", cpu_worker_bytes
    else:
        key, measured_as, planned = "device_peak_mib", "device", planned_actor_bytes
    checks = []
    for stage, planned_bytes in planned(memory, config, plan).items():
        peak = stage_peaks.get(stage, {}).get(key)
        measured = int(peak * MIB) if peak is not None else None
        checks.append(StageCheck(stage, planned_bytes, measured, measured_as))
    return checks


def write_memory_check(checks: list[StageCheck], path: Path) -> None:
    """The checks as JSON: per stage planned and measured bytes, what was measured, the
    ratio and, for device bytes, whether it is within :data:`DEVICE_TOLERANCE`."""
    rows = [
        {
            "stage": check.stage,
            "planned_bytes": check.planned,
            "measured_bytes": check.measured,
            "measured_as": check.measured_as,
            "ratio": None if check.ratio is None else round(check.ratio, 4),
            "within_tolerance": check.within_tolerance,
        }
        for check in checks
    ]
    path.write_text(json.dumps({"tolerance": DEVICE_TOLERANCE, "stages": rows}, indent=2) + "\n")


def format_memory_check(checks: list[StageCheck]) -> str:
    """``memory planned / measured per device ...: rollout 2.69G / 3.10G device (1.15x,
    within +-15%), ...`` (on a CPU: ``per worker`` and ``host RSS``, the ratio alone);
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
            verdict = ""
            if check.within_tolerance is not None:
                where = "within" if check.within_tolerance else "outside"
                verdict = f", {where} +-{DEVICE_TOLERANCE:.0%}"
            text += f" ({check.ratio:.2f}x{verdict})"
        parts.append(text)
    if not parts:
        return ""
    per = "device" if checks[0].measured_as == "device" else "worker"
    return f"memory planned / measured per {per} (actor, peak of the run): " + ", ".join(parts)
