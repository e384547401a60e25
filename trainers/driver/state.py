"""What the driver knows about a started run: its config and plan, the worker groups,
the dock, and where the run stands. Start-up (setup.py) fills it; the iteration runners,
the checkpoints and the rollout workers' hand-over read it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from mindrl.algorithm import Algorithm
from mindrl.config.layout import ROLLOUT_WORKER
from mindrl.config.schema import AlgorithmConfig, MindRLConfig
from mindrl.data import PromptDataset
from mindrl.dock import DockClient
from mindrl.run_plan import RunPlan
from mindrl.workers.group import WorkerGroup
from mindrl.workers.placement import DevicePlacement

T = TypeVar("T")


@dataclass
class RunState:
    """Everything the iteration loop and the checkpoints need."""

    config: MindRLConfig
    trainer: str
    algorithm: Algorithm
    options: AlgorithmConfig
    plan: RunPlan
    kl: Any
    run_dir: Path
    checkpoint_dir: Path
    dataset: PromptDataset
    groups: dict[str, WorkerGroup] = field(default_factory=dict)
    #: The run's devices as one placement group (one bundle per device).
    placement: DevicePlacement | None = None
    #: A disaggregated embodied run's environment-worker placement group.
    env_workers: Any = None
    dp_ranks: dict[str, list[int]] = field(default_factory=dict)
    rendezvous: dict[str, tuple[str, int]] = field(default_factory=dict)
    worker_nodes: dict[str, str] = field(default_factory=dict)
    rank_nodes: dict[str, list[str]] = field(default_factory=dict)  # role -> node of each rank
    gen_dp_ranks: list[int] = field(default_factory=list)
    dock_handle: Any = None
    dock: DockClient | None = None
    ray_started_here: bool = False
    start_iteration: int = 0
    finished_iteration: int = -1
    resumed: bool = False
    dataset_eos: int = 0
    resume_steps: dict[str, Path] = field(default_factory=dict)  # role -> checked step folder
    #: The resumed checkpoint's bookkeeping of samples in flight, for the iteration runner.
    in_flight: dict[str, Any] | None = None
    #: An iteration is running: the runner's samples in flight are not a checkpoint's now.
    iterating: bool = False
    #: Checkpoints that could not be written and the run trained on (checkpoint.on_error).
    checkpoint_failures: int = 0

    def dp_size(self, role: str) -> int:
        """Data-parallel groups of ``role``: the TP / PP peers of a DP rank form one."""
        return len(set(self.dp_ranks[role]))

    def per_worker(self, role: str, parts: Sequence[T]) -> list[T]:
        """One part per data-parallel group -> one per worker of ``role``, in rank order
        (the TP / PP peers of a DP rank get the same samples)."""
        return [parts[r] for r in self.dp_ranks[role]]

    def part_warehouses(
        self, role: str, part_of_rank: Sequence[int] | None = None
    ) -> list[int | None] | None:
        """The warehouse beside each data-parallel part of ``role`` (its first rank's
        node), so a claim hands each part what its node stores; ``part_of_rank``: the part
        each rank takes (default the role's DP ranks; generation: ``gen_dp_ranks``)."""
        nodes = self.rank_nodes.get(role)
        if self.dock is None or not nodes or not self.config.dock.local_claims:
            return None
        ranks = self.dp_ranks.get(role, range(len(nodes))) if part_of_rank is None else part_of_rank
        first: dict[int, int] = {}
        for rank, part in enumerate(ranks):
            first.setdefault(part, rank)
        return [self.dock.warehouse_on(nodes[first[part]]) for part in sorted(first)]

    def generation_warehouses(self) -> list[int | None] | None:
        """The warehouse beside each generation data-parallel part: its rollout worker's
        node where rollout workers generate (disaggregated), else its actor ranks'."""
        role = ROLLOUT_WORKER if ROLLOUT_WORKER in self.groups else "actor"
        return self.part_warehouses(role, self.gen_dp_ranks)

    def trained_groups(self) -> list[WorkerGroup]:
        return [self.groups[name] for name in ("actor", "critic") if name in self.groups]

    def position(self, in_flight: dict[str, Any] | None = None) -> dict:
        """The driver's side of a checkpoint: what iteration, data and KL come next, and
        the iteration runner's bookkeeping of the samples it keeps in flight, if any."""
        position = {
            "next_iteration": self.finished_iteration + 1,
            "dataset": self.dataset.state_dict(),
            "kl_coef": self.kl.value,
        }
        if in_flight is not None:
            position["in_flight"] = in_flight
        return position
