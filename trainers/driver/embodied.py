"""One iteration of an embodied run: the actor's ranks step their vector environments
with the vision-language-action policy and put each chunk step into the dock, then train
on the samples the driver claims for them (docs/architecture.md §15).

``rollout`` (every actor rank: reset, ``horizon / chunk_size`` chunk steps of generate
-> chunk_step, the episodes' advantages, the chunk steps put into the dock) -> ``update``
(the driver claims the samples for the actor's data-parallel ranks; each fetches its
share and takes epochs x mini-batches on it) -> the dock is cleared for the next
iteration. The driver carries indexes and gets the episodes' sums and the update's
metrics back, which make the record (mindrl/workers/embodied.py).
"""

from __future__ import annotations

import time
from typing import Any

from mindrl.metrics import mean_by_key
from mindrl.metrics.memory import MEMORY_RECORD_KEY
from trainers.driver.iteration import TIMING_KEYS, BatchSource, IterationRunner, Ledger
from trainers.driver.state import RunState

#: Behaviour-cloning steps per call to the actor's ranks: a progress line after each.
CLONE_STEPS_PER_CALL = 50
#: The rollout reports' sums over the data-parallel leaders (mindrl/workers/embodied.py).
EPISODE_SUMS = (
    "episodes",
    "successes",
    "return_sum",
    "length_sum",
    "groups_dropped",
    "chunk_steps",
)


class EmbodiedRunner(IterationRunner):
    """Runs an embodied run's iterations (module docstring). The shared runner's ledger,
    stage timing, claims, memory record and checkpoint hooks are reused; it has no batch
    source of its own (the ranks put the samples themselves)."""

    def __init__(self, run: RunState) -> None:
        super().__init__(run, BatchSource)

    def run_iteration(self, iteration: int) -> dict[str, Any]:
        start = time.perf_counter()
        ledger = Ledger()
        cloned = []
        if iteration == 0 and self.config.env.clone_steps:
            cloned = self._clone(ledger)
        episodes = self.stage(ledger, "rollout", self._rollout, iteration)
        chunk_steps = int(episode_sums(episodes)["chunk_steps"])
        updates = self.stage(ledger, "update", self._update_chunk_steps, chunk_steps)
        self.timed_dock(ledger, self.run.dock.clear)
        seconds = time.perf_counter() - start
        return self._record(episodes, cloned + updates, ledger, seconds)

    def _clone(self, ledger: Ledger) -> list[dict]:
        """The behaviour-cloned start, before the first rollout (a resumed run starts
        past iteration 0, from weights that already hold it), in calls of
        :data:`CLONE_STEPS_PER_CALL` steps with a progress line after each; the first and
        last steps' mean NLL of the expert's tokens for the record."""
        total, nll = self.config.env.clone_steps, {}
        for first in range(0, total, CLONE_STEPS_PER_CALL):
            count = min(CLONE_STEPS_PER_CALL, total - first)
            part = mean_by_key(self.stage(ledger, "clone", self._clone_part, first, count, total))
            nll.setdefault("clone_nll_first", part["clone_nll_first"])
            nll["clone_nll_last"] = part["clone_nll_last"]
            print(
                f"clone {first + count}/{total} (env.clone_steps): nll {nll['clone_nll_last']:.3f}"
            )
        return [nll]

    def _clone_part(self, first: int, count: int, total: int) -> list[dict]:
        return self.run.groups["actor"].call(
            "embodied_clone", first, count, total, stage="clone", timeout_s=self.timeout
        )

    def _rollout(self, iteration: int) -> list[dict]:
        return self.run.groups["actor"].call(
            "embodied_rollout", iteration, stage="rollout", timeout_s=self.timeout
        )

    def _update_chunk_steps(self, chunk_steps: int) -> list[dict]:
        """The actor's ranks train on the rollout's ``chunk_steps`` samples, each
        data-parallel rank on its claimed share, in as many mini-batches as
        ``actor.mini_batch_size`` groups make (at most one per sample of the smallest
        share: every rank takes every step)."""
        stage = self.plan.stage("update")
        parts = self._by_dp_rank("update", stage.role, list(stage.reads), chunk_steps)
        per_step = self.config.actor.mini_batch_size or self.G
        minibatches = max(min(-(-self.G // per_step), min(len(p) for p in parts)), 1)
        return self.run.groups["actor"].call_each(
            "embodied_update",
            [(part, minibatches) for part in parts],
            stage="update",
            timeout_s=self.timeout,
        )

    def _record(
        self, rollouts: list[dict], updates: list[dict], ledger: Ledger, seconds: float
    ) -> dict[str, Any]:
        """The iteration's record: the episodes' success rate, mean return and length,
        the update's metrics, environment frames per rollout second (and per rollout and
        update second), the simulators' and generation's seconds, the stages' times and
        memory."""
        sums = episode_sums(rollouts)
        episodes = max(sums["episodes"], 1.0)
        rollout_s = ledger.stages["rollout"]
        epoch_s = rollout_s + ledger.stages["update"]  # the clone, once, not included
        return {
            "success_rate": sums["successes"] / episodes,
            "reward_mean": sums["return_sum"] / episodes,
            "episode_length_mean": sums["length_sum"] / episodes,
            "episodes": sums["episodes"],
            "groups_dropped": sums["groups_dropped"],
            "chunk_steps": sums["chunk_steps"],
            **mean_by_key(updates, skip=TIMING_KEYS),
            "env_frames_per_s": sums["length_sum"] / rollout_s if rollout_s > 0 else 0.0,
            "epoch_frames_per_s": sums["length_sum"] / epoch_s if epoch_s > 0 else 0.0,
            **stage_seconds(rollouts),
            "iteration_time_s": seconds,
            "time": ledger.stages,
            "busy": ledger.busy,
            "overhead": ledger.overhead(seconds),
            MEMORY_RECORD_KEY: self.memory_record(ledger),
        }


def episode_sums(reports: list[dict]) -> dict[str, float]:
    """The ranks' rollout reports added up (only data-parallel leaders report sums: the
    TP peers of a rank step the same environments)."""
    return {key: sum(r.get(key, 0.0) for r in reports) for key in EPISODE_SUMS}


def stage_seconds(reports: list[dict]) -> dict[str, float]:
    """The data-parallel leaders' environment and generation seconds (in all and per
    pipeline stage: ``env_s``, ``env_s_<stage>``, ``generate_s``, ...), averaged: the
    ranks step their environments at the same time."""
    leaders = [r for r in reports if "episodes" in r]
    keys = [key for key in leaders[0] if key.startswith(("env_s", "generate_s"))]
    return {key: sum(r[key] for r in leaders) / len(leaders) for key in keys}
