"""Iterations of a disaggregated run, with bounded off-policy asynchrony.

The rollout workers generate on devices of their own (trainers/driver/rollout_placement.py).
With ``rollout.max_staleness: 0`` an iteration is today's, on-policy: the new weights go to
the rollout workers, they generate, the batch is scored and trained on. With
``max_staleness >= 1`` the next iteration's batch starts generating, with the weights the
rollout workers hold, as soon as this batch's scoring stages have claimed their samples,
and generates while this batch's advantages and update run; the driver collects it at
the start of the next iteration and only then sends the new weights. One batch is in
flight at a time, so a trained sample is at most one update old.

Sample versions: a rollout worker stamps every sample it puts with the version of its
weights (updates they include); the update stage's TD controller keeps it as metadata,
and before each update the driver reads it back (``DockClient.versions``), checks the
bound and records ``staleness_max`` / ``staleness_mean`` of what it trains on.

The dock holds two batches (``RunPlan.sample_batches``): iteration ``k`` uses slots
``(k % 2) * G ...``; a trained batch's indexes are recycled, not the whole dock cleared,
so the batch in flight keeps its samples.

A checkpoint between iterations waits for the batch in flight and keeps it, with its
versions (:meth:`DisaggregatedSource.in_flight_state`); a resumed run trains it as the
uninterrupted run would (docs/architecture.md §8).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mindrl.config.layout import ROLLOUT_WORKER
from mindrl.dock import DockSlice
from mindrl.run_plan import PROMPT_FIELDS
from mindrl.workers.generation import RESPONSE_FIELDS
from mindrl.workers.group import wait_all
from trainers.driver.iteration import (
    VERSION_STAGE,
    BatchSource,
    InFlightState,
    IterationRunner,
    Ledger,
    Sampled,
)
from trainers.driver.rollout_placement import push_weights


class StalenessBoundError(RuntimeError):
    """A sample older than ``rollout.max_staleness`` updates reached the update (a bug)."""


@dataclass
class InFlight:
    """A batch whose generation was started: its indexes, what it drew, its calls and,
    once waited for, their reports (a batch restored from a checkpoint has none)."""

    iteration: int
    indexes: np.ndarray
    sampled: Sampled
    refs: list[Any] = field(default_factory=list)
    started: float = 0.0
    results: list[dict] | None = None


class DisaggregatedSource(BatchSource):
    """Batches generated on the rollout workers, the next one beside this one's training
    when ``max_staleness >= 1`` (see module docstring)."""

    def __init__(self, runner: IterationRunner) -> None:
        super().__init__(runner)
        run = runner.run
        self.run, self.config, self.plan = run, runner.config, runner.plan
        self.G, self.timeout = runner.G, runner.timeout
        self.rollout = run.groups[ROLLOUT_WORKER]
        self.max_staleness = self.config.rollout.max_staleness
        self.weights_version = run.start_iteration  # what the rollout workers hold
        self.in_flight: InFlight | None = None

    def draw(self, iteration: int, ledger: Ledger) -> Sampled:
        """The batch in flight (started now if none is), generated and rewarded; then the
        trainer's weights (``iteration`` updates) go to the idle rollout workers."""
        if self.in_flight is None:
            self._sync_weights(iteration, ledger)
            self.in_flight = self._launch(iteration, ledger)
        batch, self.in_flight = self.in_flight, None
        self._collect(batch, ledger)
        self._sync_weights(iteration, ledger)  # the rollout workers are idle now
        return batch.sampled

    def beside_training(self, iteration: int, ledger: Ledger) -> None:
        """Every stage that could claim the next batch's samples has claimed this one's:
        start generating the next batch, with the weights the workers hold."""
        if self.max_staleness and iteration + 1 < self.config.iterations:
            self.in_flight = self._launch(iteration + 1, ledger)

    def before_update(self, indexes: np.ndarray, iteration: int) -> dict[str, Any]:
        return self._staleness(indexes, iteration)

    def release(self, ledger: Ledger, trained: np.ndarray) -> None:
        """Recycle the trained batch only: the batch in flight keeps its samples."""
        self.runner.timed_dock(ledger, self.run.dock.recycle, trained)

    # ---- generation on the rollout workers -------------------------------------------------
    def _sync_weights(self, iteration: int, ledger: Ledger) -> None:
        """Send the trainer's weights (``iteration`` updates) unless the workers have them."""
        if self.weights_version == iteration:
            return
        started = time.perf_counter()
        report = push_weights(self.run, iteration)
        ledger.add_stage("weight_transfer", time.perf_counter() - started, [report])
        self.weights_version = iteration

    def _launch(self, iteration: int, ledger: Ledger) -> InFlight:
        """Put the prompts of ``iteration``'s batch and start generating it."""
        first = (iteration % self.plan.sample_batches) * self.G
        slots = list(range(first, first + self.G))
        runner = self.runner
        batch = InFlight(iteration, runner.indexes(slots), Sampled(kept=slots, draws=1))
        runner.put_prompts(ledger, batch.indexes, self.run.dataset.next_batch(), batch.sampled)
        args = runner.generation_args(batch.indexes, iteration, 0)
        batch.refs = self.rollout.submit_each("generate", args)
        batch.started = time.perf_counter()
        return batch

    def _collect(self, batch: InFlight, ledger: Ledger) -> None:
        """Wait for ``batch``'s generation and score it; what generation ran before this
        wait overlapped the previous iteration's training."""
        waited = time.perf_counter()
        results = self._wait(batch)
        wall = time.perf_counter() - waited
        ledger.add_stage("rollout", wall, results)
        busy = max((r["busy_s"] for r in results), default=0.0)
        ledger.overlap["rollout"] = max(min(busy, waited - batch.started), 0.0)
        runner = self.runner
        scored = runner.stage(ledger, "reward", runner.score_stage, "reward", batch.indexes)
        sampled = batch.sampled
        sampled.samples = len(batch.indexes)
        sampled.reward_sum = sum(r["reward_sum"] for r in scored)
        sampled.response_tokens = sum(r["response_tokens"] for r in scored)
        dropped = runner.book_rewards(sampled, scored)
        if dropped:  # no refill: the next batch is already generating
            sampled.kept = runner.trim(ledger, runner.drop_groups(ledger, sampled.kept, dropped))

    def _wait(self, batch: InFlight) -> list[dict]:
        """``batch``'s generation reports, waited for once."""
        if batch.results is None:
            names = self.rollout.names()
            batch.results = wait_all(batch.refs, names, "rollout", self.timeout)
        return batch.results

    # ---- checkpoints: the batch in flight ------------------------------------------------------
    def in_flight_state(self) -> InFlightState | None:
        """The next batch, generating with the weights before this update: waited for, so a
        checkpoint keeps its prompts and finished responses with their versions."""
        batch = self.in_flight
        if batch is None:
            return None
        self._wait(batch)
        sampled = batch.sampled
        bookkeeping = {
            "iteration": batch.iteration,
            "slots": sampled.kept,
            "prompt_tokens": sampled.prompt_tokens,
        }
        slices = [
            DockSlice(batch.indexes, PROMPT_FIELDS),
            DockSlice(batch.indexes, RESPONSE_FIELDS, VERSION_STAGE),
        ]
        return InFlightState(bookkeeping, slices)

    def restore_in_flight(self, bookkeeping: dict[str, Any]) -> None:
        """The batch a checkpoint kept, generated and back in the dock: the next iteration
        scores and trains it as it would have without the interruption."""
        if not self.max_staleness:  # on-policy now: nothing may train on older weights
            super().restore_in_flight(bookkeeping)
            return
        slots = list(bookkeeping["slots"])
        sampled = Sampled(kept=slots, draws=1, prompt_tokens=bookkeeping["prompt_tokens"])
        indexes = self.runner.indexes(slots)
        self.in_flight = InFlight(bookkeeping["iteration"], indexes, sampled, results=[])
        self.runner.reclaim_prompts(indexes)

    # ---- the bound ---------------------------------------------------------------------------
    def _staleness(self, indexes: np.ndarray, iteration: int) -> dict[str, float]:
        """Updates between each sample's weights and the trained ones, from the update
        stage's TD controller; a sample past the bound stops the run."""
        versions = self.run.dock.versions("update", indexes)
        lag = iteration - versions
        if (versions < 0).any() or lag.max() > self.max_staleness:
            raise StalenessBoundError(
                f"iteration {iteration}: the update would train on samples of weights "
                f"versions {sorted(set(versions.tolist()))} (-1: none recorded), past "
                f"rollout.max_staleness={self.max_staleness}"
            )
        return {"staleness_max": int(lag.max()), "staleness_mean": float(lag.mean())}
