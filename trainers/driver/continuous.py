"""Iterations with continuous generation on the rollout workers (``rollout.continuous``).

The rollout workers never wait for a batch (mindrl/workers/continuous.py): each keeps up
to ``rollout.continuous_slots`` sequences decoding, refills a finished one's slots from
the groups the driver fed it, puts a group into the dock the moment its last response
ends, and loads new weights between two decode steps. This runner keeps the dock a pool
of ``(max_staleness + 1) x G`` group slots (partial rollout's pool, whose bookkeeping it
shares: a group's draw order, paused responses, the in-flight checkpoint):

* Prompts go into every free slot, and are fed to the workers, once the workers hold the
  trained weights: a group then starts at most ``max_staleness`` updates before the one
  that trains it, were groups trained in draw order (AReaL's admission bound). The slots
  an update freed are refilled before the next update starts at the latest, so every
  batch decodes during the update before the one that trains it.
* ``reward``, ``ref_logp`` (the frozen reference) and a group-local estimator's
  ``advantage`` (:func:`streamed_stages`; computed in reward's call, one fetch and one
  put for both) score finished groups as they arrive, while the workers decode and the
  trainer updates: each keeps one chunked claim or one chunk in flight
  (trainers/driver/streaming.py's calls and chunks), its next claim opened when its
  workers finish the last chunk.
* An update trains ``G`` groups picked by draw order, not by finishing order
  (:meth:`ContinuousSource._pick`): every group that would pass the staleness bound at
  the next update is *due* and waited for, finished or not; the rest of the batch is
  the oldest finished younger groups. So no group is refused for its length, and every
  drawn group trains within ``max_staleness`` updates; a scored group past the bound
  all the same (none in a steady run) is refused, its slots freed and refilled
  (``dropped_stale_groups``). Finished groups not picked are held out of the training
  stages' claims meanwhile; ``old_logp`` and ``values`` (models that train) score the
  kept groups then, as today.
* After the update the new weights go to the workers without waiting (the actor's
  gather and broadcast run beside the next scoring and the workers' decoding; the next
  update waits for the actor's part); the record shows the hand-over apart
  (``time.weight_transfer``).

Each token's ``rollout_logprob`` is the one of the weights that sampled it and the loss
weights it by its behaviour ratio (trainers/core.py, ``behaviour_weights``), as for
partial rollout and one-batch-ahead asynchrony. A checkpoint interrupts the workers: a
live sequence becomes a paused response in the dock, continued from its prefix after the
save or on resume (docs/architecture.md §8).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import ray

from mindrl.config.layout import ROLLOUT_WORKER
from mindrl.dock import group_slots
from mindrl.metrics.memory import book_peaks
from mindrl.planner.generation import continuous_slots
from mindrl.run_plan import ENV_REWARD, RunPlan, continuous_groups
from mindrl.workers.continuous import Feed
from mindrl.workers.group import POLL_S, StageTimeoutError, wait_all
from trainers.driver.iteration import (
    BatchSource,
    InFlightState,
    IterationRunner,
    Ledger,
    Sampled,
)
from trainers.driver.partial_rollout import FlightPool
from trainers.driver.rollout_placement import WeightPush, start_push
from trainers.driver.state import RunState
from trainers.driver.streaming import (
    ChunksInFlight,
    StageCall,
    StageStream,
    answered_stream,
    reward_with_advantages_call,
    stage_call,
)

#: The decode loop's counters a record reports per iteration (mindrl/workers/continuous.py).
LOOP_COUNTERS = ("decode_s", "idle_s", "steps", "weight_loads")
#: Scoring stages that take finished groups while the workers decode: their models do
#: not train, so a score taken before an update is the score after it.
STREAMED = ("reward", "ref_logp")


def streamed_stages(plan: RunPlan) -> list[str]:
    """The stages scored as groups finish: :data:`STREAMED`, and ``advantage`` where the
    estimator reads one group alone (``group_local_advantages``: GRPO, RLOO) and nothing
    a later stage writes. Its advantages are then the same whenever computed, so they are
    computed in the reward stage's call (:func:`reward_with_advantages_call`), off the path
    between the last scored group and the update. (An environment's rewards are its
    episodes', not a rule's: that stage keeps its own call, so no advantage joins it.)"""
    stages = [s for s in STREAMED if s in plan.stage_names]
    streamed = {"rollout", *stages}
    later = {f for s in plan.stages if s.name not in streamed for f in s.writes}
    fusable = "reward" in stages and ENV_REWARD not in plan.stage("reward").reads
    if fusable and plan.group_local_advantages and not later & set(plan.stage("advantage").reads):
        stages.append("advantage")
    return stages


def stream_calls(run: RunState, stages: list[str]) -> dict[str, StageCall]:
    """Each stream's call: one per streamed stage, the advantage stage's in reward's."""
    if "advantage" in stages:
        calls = {"reward": reward_with_advantages_call(run)}
        stages = [s for s in stages if s not in ("reward", "advantage")]
    else:
        calls = {}
    return calls | {s: stage_call(run, run.plan.stage(s)) for s in stages}


class ContinuousSource(BatchSource):
    """Batches from continuously decoding rollout workers (module docstring), over a
    :class:`FlightPool` as partial rollout keeps (draw order, paused responses, the
    in-flight checkpoint) of its own size."""

    #: A group is scored and trained whole: the workers put it once its last response ends.
    whole_group_claims = True

    def __init__(self, runner: IterationRunner) -> None:
        super().__init__(runner)
        run = runner.run
        self.G, self.N, self.config = runner.G, runner.N, runner.config
        self.run, self.plan, self.timeout = run, runner.plan, runner.timeout
        self.pool = FlightPool(runner, continuous_groups(self.config))
        self.iteration = 0  # the one running
        self.workers = run.groups[ROLLOUT_WORKER]
        self.max_staleness = self.config.rollout.max_staleness
        self.weights_version = run.start_iteration  # what the workers hold
        self.push: WeightPush | None = None
        self.running = False
        self.unstarted = np.zeros(0, dtype=np.int64)
        stages = streamed_stages(self.plan)
        self.streams = {s: StageStream(call) for s, call in stream_calls(run, stages).items()}
        self.scored = tuple(stages)
        self.chunks = ChunksInFlight()
        #: Stage -> the chunks its workers scored since the last record.
        self.scoring_chunks: dict[str, int] = {}
        #: Slot -> the streamed stages that finished scoring its group.
        self.scored_by: dict[int, set[str]] = {}
        #: Index -> (reward, response tokens), from the reward workers' reports.
        self.rewards: dict[int, tuple[float, float]] = {}
        #: Slot -> the oldest version among its scored group's tokens (fixed once put:
        #: asked of the dock once, not at every poll of the wait).
        self.versions: dict[int, int] = {}
        self.dropped = 0
        #: The reward reports since the last record (in a Sampled: its book) and the
        #: scored groups holding a sample whose reward failed (reward.on_failure).
        self.scoring = Sampled()
        self.failed: set[int] = set()
        self.lags: np.ndarray = np.zeros(0)
        #: Each worker's loop counters at the last record (a restarted loop counts anew).
        self.loop_counters: list[dict[str, float]] | None = None
        self.loop_since: dict[str, float] = {}

    # ---- the batch ----------------------------------------------------------------------------
    def draw(self, iteration: int, ledger: Ledger) -> Sampled:
        """Wait until ``G`` groups within the bound are scored; hold the others in the
        dock out of the training stages' claims."""
        runner = self.runner
        self.iteration, self.pool.drawn_before, self.dropped = iteration, self.pool.drawn, 0
        if not self.running:
            self._start(iteration)
        waited = time.perf_counter()
        kept = self._gather(ledger, iteration)
        ledger.stages["rollout"] = time.perf_counter() - waited
        self._refill_before_update(ledger)
        indexes = runner.indexes(kept)
        sampled = self._sampled(kept, indexes)
        self.pool.held = sorted(set(self.pool.flights) - set(kept))
        training = self._training_stages()
        if self.pool.held:
            held = runner.indexes(self.pool.held)
            runner.timed_dock(ledger, self.run.dock.hold, held, True, training)
        return sampled

    def after_update(self, iteration: int, ledger: Ledger) -> None:
        """Book the streamed stages and the workers' decode loops since the last record;
        send the new weights without waiting. The workers are asked first: a rollout
        worker's actor runs one call at a time, so asked after the push started, its
        answer waited for the whole hand-over (the weights' receive ran first), which then
        stood between this update and the next instead of beside them."""
        self._book_streams(ledger)
        self._book_workers(ledger)
        if iteration + 1 < self.config.iterations:
            self.push = start_push(self.run, iteration + 1)  # overlaps what follows

    def _sampled(self, kept: list[int], indexes: np.ndarray) -> Sampled:
        """The trained groups' figures; the reward stage's reports since the last record
        (its scoring runs beside decoding, so those are of the groups it scored meanwhile)."""
        rewards = [self.rewards.pop(int(i)) for i in indexes]
        prompt_tokens = sum(self.pool.flights[slot].prompt_tokens for slot in kept) * self.N
        scoring, self.scoring = self.scoring.rewards, Sampled()
        return Sampled(
            kept=kept,
            draws=1,
            samples=len(indexes),
            reward_sum=float(sum(r for r, _ in rewards)),
            response_tokens=float(sum(t for _, t in rewards)),
            prompt_tokens=float(prompt_tokens),
            rewards=scoring,
        )

    def _training_stages(self) -> list[str]:
        """The stages whose claims must take exactly the kept groups."""
        return [s for s in self.plan.stage_names if s != "rollout" and s not in self.scored]

    # ---- the workers: start, feed, weights ----------------------------------------------------
    def _start(self, iteration: int) -> None:
        """Start every worker's decode loop and feed it what an interruption left."""
        slots = continuous_slots(self.config)
        params = self.runner.sampling_params(iteration, 0)
        self.workers.call(
            "start_continuous", params, slots, stage="rollout", timeout_s=self.timeout
        )
        self.running, self.loop_counters = True, None
        resumed = np.union1d(self.pool.paused, self.unstarted)
        if len(resumed):
            self._feed(resumed, self.pool.paused)
        self.pool.paused = self.unstarted = np.zeros(0, dtype=np.int64)

    def _feed(self, indexes: np.ndarray, resumed: np.ndarray) -> None:
        """Whole groups dealt round-robin over the workers."""
        groups = np.unique(group_slots(indexes, self.N))
        calls = []
        for rank, worker in enumerate(self.workers.workers):
            mine = np.isin(group_slots(indexes, self.N), groups[rank :: self.workers.size])
            if mine.any():
                part = indexes[mine]
                calls.append(worker.feed.remote(Feed(part, np.intersect1d(part, resumed))))
        names = self.workers.names()[: len(calls)]
        wait_all(calls, names, "rollout", self.timeout)

    def _refill(self, ledger: Ledger) -> None:
        """Fresh prompts into every free slot, fed to the workers, once they hold the
        trained weights (the admission bound, module docstring)."""
        runner = self.runner
        free = self.pool.free()
        if not free or self.push is not None or self.weights_version < self.iteration:
            return
        batch = self.run.dataset.next_batch(len(free))
        indexes = runner.indexes(free)
        runner.put_prompts(ledger, indexes, batch, Sampled())
        self.pool.board(free, batch, self.iteration)
        (claimed,) = runner.timed_dock(
            ledger,
            self.run.dock.claim,
            "rollout",
            ["prompt_ids"],
            len(indexes),
            True,
            1,
            self.timeout,
        )
        self._feed(np.sort(claimed), np.zeros(0, dtype=np.int64))

    def _refill_before_update(self, ledger: Ledger) -> None:
        """Refill the slots the last update freed before this update starts, the hand-over
        waited for if it is still running.

        The batch is often complete before the hand-over ends (the due groups decoded
        during the last update); refilled only at the next wait, the freed slots then
        stayed empty for a whole update and the workers idled, while the next batch's
        groups started an update late. Waiting costs the update nothing: actor rank 0
        runs one call at a time, so the update starts after its sends anyway."""
        if self.push is not None:
            self._push_done(ledger, blocking=True)
        self._refill(ledger)

    def _push_done(self, ledger: Ledger, blocking: bool = False) -> None:
        """The hand-over ended: book it; ``blocking``: the driver waited for it before the
        update, so that wait is not overlap (waited for inside the wait for groups, it
        ran beside scoring and decoding)."""
        push, self.push = self.push, None
        waited = time.perf_counter()
        report = push.wait(self.timeout)
        done = time.perf_counter()
        wall = done - push.started
        ledger.add_stage("weight_transfer", wall, [report])
        ledger.overlap["weight_transfer"] = wall - (done - waited if blocking else 0.0)
        self.weights_version = push.version

    # ---- waiting for G scored groups ----------------------------------------------------------
    def _gather(self, ledger: Ledger, iteration: int) -> list[int]:
        """Stream, score and refill until the groups :meth:`_pick` trains are scored."""
        deadline = time.perf_counter() + self.timeout
        for stream in self.streams.values():
            if stream.claim is None and not self.chunks.of(stream):
                self._open_claim(stream)
        while True:
            self._refill(ledger)
            ready = self._scored()
            failed = [slot for slot in ready if slot in self.failed]
            if failed:  # reward.on_failure drop_group: their slots refill; pick again
                self._drop(ledger, failed, stale=False)
                continue
            kept = self._pick(ready, iteration)
            if kept is not None:
                lags = self._lags(ledger, ready, iteration)
                stale = [slot for slot in ready if lags[slot] > self.max_staleness]
                if not stale:
                    self.lags = np.array([lags[slot] for slot in kept])
                    return kept
                self._drop(ledger, stale)  # their slots refill; pick again
                continue
            refs = [*self.chunks.refs(), *(s.claim.ref for s in self.streams.values() if s.claim)]
            refs += [] if self.push is None else self.push.refs
            done, _ = ray.wait(refs, num_returns=1, timeout=POLL_S)
            if not done:
                self._check_workers(deadline, len(ready))
                continue
            deadline = time.perf_counter() + self.timeout  # progress
            if self.push is not None and done[0] in self.push.refs:
                self._push_done(ledger)
            elif done[0] in self.chunks:
                self._chunk_part_done(done[0])
            else:
                self._claim_answered(done[0])

    def _scored(self) -> list[int]:
        """The groups every streamed stage scored, by draw order."""
        ready = [slot for slot, done in self.scored_by.items() if len(done) == len(self.streams)]
        return sorted(ready, key=lambda slot: self.pool.flights[slot].order)

    def _lags(self, ledger: Ledger, ready: list[int], iteration: int) -> dict[int, int]:
        """Scored group -> its lag: updates between its oldest token and the trained weights.

        Asked of the dock once a pick is complete, for every scored group whose version
        is not known yet, in one call: a group's version is fixed once it is put, and
        asking at each arrival cost a round trip per scored chunk while nothing needed it
        (a stale group is only found where a pick would train or pass it)."""
        new = [slot for slot in ready if slot not in self.versions]
        if new:
            firsts = np.asarray(new, dtype=np.int64) * self.N  # a group is put whole: one version
            asked = self.runner.timed_dock(ledger, self.run.dock.versions, "update", firsts)
            self.versions |= dict(zip(new, asked.tolist(), strict=True))
        return {slot: iteration - self.versions[slot] for slot in ready}

    def _pick(self, ready: list[int], iteration: int) -> list[int] | None:
        """The ``G`` groups this update trains, by draw order; None while one is missing.

        Taking the oldest *finished* groups starves long responses: the short ones finish
        first, train first, and a long one ages past the bound while it decodes and is
        refused, so the trained batch is skewed to short responses (and easy prompts)
        and a prompt whose responses always take longer than the bound never trains.
        The async RL systems that bound staleness (AReaL's admission control, verl's
        fully-async staleness threshold, tinker's ``sampling_steps_ahead``) bound it by
        how far generation may run ahead and train oldest first, refusing nothing: the
        trained lengths then follow the drawn ones. Here the pool and the admission rule
        (module docstring) bound the run-ahead; this picks, by draw order, every group
        drawn more than ``max_staleness - 1`` updates ago (it would pass the bound at
        the next update, so it is *due* now and the update waits for it, however long its
        responses), then the oldest finished younger groups, which may go ahead of an
        unfinished group of their age only while that one can still train within the
        bound. Its stale tokens keep their behaviour log-probs and the loss weights each
        by its ratio (trainers/core.py). The wait costs throughput only where a due
        group's responses outlast the ``max_staleness`` updates it had to finish; with
        ``max_staleness: 0`` every group is due: the on-policy batch."""
        edge = iteration + 1 - self.max_staleness
        flights = sorted(self.pool.flights, key=lambda slot: self.pool.flights[slot].order)
        due = [slot for slot in flights if self.pool.flights[slot].iteration < edge][: self.G]
        finished = set(ready)
        if not finished.issuperset(due):
            return None
        younger = [slot for slot in ready if slot not in due][: self.G - len(due)]
        kept = due + younger
        return kept if len(kept) == self.G else None

    def _drop(self, ledger: Ledger, slots: list[int], stale: bool = True) -> None:
        """Take ``slots`` out of the pool (past the staleness bound, or their reward
        failed): their samples leave the dock and the slots refill."""
        self.failed -= set(slots)
        indexes = self.runner.indexes(slots)
        self.runner.timed_dock(ledger, self.run.dock.recycle, indexes)
        for slot in slots:
            self.pool.flights.pop(slot)
            self.scored_by.pop(slot)
            self.versions.pop(slot, None)
        for index in indexes.tolist():
            self.rewards.pop(index, None)
        self.dropped += len(slots) if stale else 0

    def _check_workers(self, deadline: float, ready: int) -> None:
        """No event within a poll: a worker whose loop failed says so; past the deadline
        the run stops, naming what it waited for."""
        self.workers.call("continuous_status", stage="rollout", timeout_s=self.timeout)
        if time.perf_counter() > deadline:
            raise StageTimeoutError(
                f"continuous generation: {ready} of {self.G} groups scored and nothing "
                f"arrived within {self.timeout:.0f} s (rollout workers, "
                f"{', '.join(self.streams)})"
            )

    def _open_claim(self, stream: StageStream) -> None:
        call = stream.call
        step = int(np.lcm(self.N, call.dp_parts))
        stream.claim = self.run.dock.claim_async(
            call.stage,
            call.fields,
            self.pool.size * self.N,
            whole_groups=True,
            dp_parts=call.dp_parts,
            timeout_s=1e9,  # open for the run: a stall is found by _check_workers
            step=step,
            part_warehouses=call.part_warehouses,
        )

    def _claim_answered(self, ref: Any) -> None:
        """A chunk for a streamed stage's workers. Its next claim opens once they are done
        with it, so that claim takes every group finished meanwhile: opened at once, it
        answered with each group as it was put, and the workers scored one group a chunk,
        paying a chunk's fetch, put and report per group on the cores that decode and
        train (about 12 ms a group on tiny)."""
        stream = answered_stream(self.streams.values(), ref)
        self.chunks.send(stream, stream.take_claim())

    def _chunk_part_done(self, ref: Any) -> None:
        """A worker of a chunk answered; once all have, the chunk's groups are scored by
        its stage (the rewards kept for the record) and the stage's next claim opens."""
        chunk = self.chunks.part_done(ref)
        if chunk is None:
            return
        for report in chunk.results:
            if "sample_rewards" in report:
                scores = zip(report["sample_rewards"], report["sample_tokens"], strict=True)
                for index, score in zip(report["indexes"].tolist(), scores, strict=True):
                    self.rewards[index] = score
        if chunk.stream.call.stage == "reward":
            self.failed |= set(self.runner.book_rewards(self.scoring, chunk.results))
        stream = chunk.stream
        for slot in np.unique(group_slots(chunk.indexes, self.N)).tolist():
            if slot in self.pool.flights:
                self.scored_by.setdefault(slot, set()).add(stream.call.stage)
        self._open_claim(stream)

    # ---- after the update ---------------------------------------------------------------------
    def release(self, ledger: Ledger, trained: np.ndarray) -> None:
        """Free the trained groups' slots; give the held ones back to the training stages."""
        runner = self.runner
        slots = np.unique(group_slots(trained, self.N)).tolist()
        self.pool.trained = [self.pool.flights.pop(slot) for slot in slots]
        for slot in slots:
            self.scored_by.pop(slot, None)
            self.versions.pop(slot, None)
        runner.timed_dock(ledger, self.run.dock.recycle, trained)
        if self.pool.held:
            indexes = runner.indexes(self.pool.held)
            training = self._training_stages()
            runner.timed_dock(ledger, self.run.dock.hold, indexes, False, training)

    def _book_streams(self, ledger: Ledger) -> None:
        """The streamed stages' work since the last record: all of it beside decoding."""
        for name, stream in self.streams.items():
            ledger.busy[name] = stream.busy_s
            ledger.overlap[name] = stream.busy_s
            ledger.stages.setdefault(name, 0.0)
            ledger.dock_beside_s += stream.dock_s  # in the scoring workers, beside decoding
            book_peaks(ledger.memory, name, stream.results)
            self.scoring_chunks[name] = stream.chunks
            stream.busy_s = stream.dock_s = 0.0
            stream.chunks = 0
            stream.results = []

    def _book_workers(self, ledger: Ledger) -> None:
        """The rollout workers' decode loops since the last record: the busiest worker's
        decode seconds (all beside training), its idle seconds, the weights it loaded
        between decode steps."""
        reports = self.workers.call("continuous_status", stage="rollout", timeout_s=self.timeout)
        since = [
            {key: r[key] - before.get(key, 0) for key in LOOP_COUNTERS}
            for r, before in zip(reports, self.loop_counters or [{}] * len(reports), strict=True)
        ]
        self.loop_counters = [{key: r[key] for key in LOOP_COUNTERS} for r in reports]
        busiest = max(since, key=lambda counters: counters["decode_s"])
        ledger.busy["rollout"] = ledger.overlap["rollout"] = busiest["decode_s"]
        self.loop_since = busiest
        book_peaks(ledger.memory, "rollout", reports)

    # ---- checkpoints: the groups in flight ----------------------------------------------------
    def in_flight_state(self) -> InFlightState | None:
        """Interrupt the workers (live sequences become paused responses in the dock) and
        keep every group not trained yet; the next iteration feeds them again."""
        if self.push is not None:
            self._push_done(Ledger())
        while self.chunks:
            (ref,), _ = ray.wait(self.chunks.refs(), num_returns=1)
            self._chunk_part_done(ref)
        if self.running:
            stops = self.workers.call("stop_continuous", stage="checkpoint", timeout_s=self.timeout)
            self.running = False
            self.pool.paused = np.concatenate([s["paused"] for s in stops]).astype(np.int64)
            self.unstarted = np.concatenate([s["unstarted"] for s in stops]).astype(np.int64)
        state = self.pool.in_flight_state(np.union1d(self.pool.paused, self.unstarted))
        if state is not None:
            state.bookkeeping["unstarted"] = self.unstarted.tolist()
        return state

    def restore_in_flight(self, bookkeeping: dict[str, Any]) -> None:
        """The groups a checkpoint kept: finished ones are scored again, the paused and
        unstarted ones fed to the workers when they start."""
        self.pool.restore(bookkeeping)
        self.unstarted = np.asarray(bookkeeping.get("unstarted", []), dtype=np.int64)

    def counts(self, sampled: Sampled) -> dict[str, Any]:
        lags = self.lags if len(self.lags) else np.zeros(1)
        loop = self.loop_since
        return {
            "trained_groups": len(self.pool.trained),
            "drawn_groups": self.pool.drawn - self.pool.drawn_before,
            "carried_groups": len(self.pool.flights),
            "dropped_stale_groups": self.dropped,
            # Updates between a trained group's oldest token and the trained weights.
            "staleness_max": int(lags.max()),
            "staleness_mean": float(lags.mean()),
            # The busiest rollout worker since the last record: decode steps, weights
            # loaded between two of them, seconds with nothing to decode.
            "decode_steps": loop.get("steps", 0),
            "weights_loaded_while_decoding": loop.get("weight_loads", 0),
            "rollout_idle_s": loop.get("idle_s", 0.0),
            # Chunks the streamed stages scored since the last record (each a claim,
            # a fetch and a put): every group finished while the last chunk scored.
            "scoring_chunks": dict(self.scoring_chunks),
        }
