"""One RL iteration through the dock (docs/architecture.md §3).

prompts -> ``rollout`` (actor ranks: reshard, generate) -> ``reward`` -> [DAPO: keep
groups whose rewards differ, refill the rest] -> ``ref_logp`` -> ``old_logp`` (skipped
when it provably equals the policy being trained: one optimizer step per iteration)
-> ``values`` (PPO) -> ``advantage`` -> ``update`` (+ ``critic_update``).

The driver only claims indexes from the stages' TD controllers and hands them to the
workers, which move the payloads themselves; what comes back are scalar metrics. Every
stage is timed, and the time not spent computing (dock transfers, resharding, Ray
scheduling and claims) is reported as the run's overhead.

What varies with the kind of run is one part, its :class:`BatchSource`: where the batch
comes from (the actor ranks here, :class:`OnlineSource`; partial rollout's rounds; the
rollout workers of a disaggregated or continuous run), what overlaps training, and what
the dock keeps after the update. :class:`IterationRunner` composes the source the run
plan names (trainers/driver/runners.py) with the steps every kind shares.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from backends.generation import SamplingParams
from mindrl.config.schema import AlgorithmConfig
from mindrl.data import PromptBatch
from mindrl.data.records import record_fields
from mindrl.dock import DockError, DockSlice, group_slots, slot_indexes
from mindrl.metrics import generation_progress, mean_by_key, print_progress_line, tokens_per_second
from mindrl.metrics.memory import MEMORY_KEYS, MEMORY_RECORD_KEY, book_peaks, peaks_by_role
from mindrl.rewards.report import FailureWindow, RewardBook
from mindrl.run_plan import GROUP_ID
from trainers.driver.state import RunState
from trainers.driver.streaming import (
    StreamedStage,
    StreamScheduler,
    advantage_parts,
    stage_call,
)

#: With no batch limit (``algorithm.max_sample_batches: 0``) say how sampling goes this often.
DRAWS_BETWEEN_NOTES = 8


@dataclass
class Ledger:
    """Wall time per stage, the busy time of its workers, and the overhead inside it.

    ``stages`` is the wall time a stage added to the iteration (a streamed stage: only
    its tail after generation ended); ``busy`` its slowest worker's compute; ``overlap``
    the part of a streamed stage's busy time that ran during generation; ``memory`` the
    largest memory peaks its workers reported (MiB, ``mindrl.metrics.memory``).

    ``dock_s`` is dock time inside the iteration's stages (the driver's dock calls, the
    stages' workers'); ``dock_beside_s`` that of stages whose wall the iteration does not
    book, because they ran beside decoding and training (continuous generation's scoring
    chunks): adding it to ``dock_s`` counted seconds other processes spent meanwhile as
    the iteration's overhead.
    """

    stages: dict[str, float] = field(default_factory=dict)
    busy: dict[str, float] = field(default_factory=dict)
    overlap: dict[str, float] = field(default_factory=dict)
    memory: dict[str, dict[str, float]] = field(default_factory=dict)
    dock_s: float = 0.0
    dock_beside_s: float = 0.0
    reshard_s: float = 0.0
    scheduling_s: float = 0.0
    #: Bytes handed to the generation side, summed over the ranks that hand over.
    handover_bytes: float = 0.0

    def add_stage(self, name: str, wall: float, results: list[dict]) -> None:
        """Stage ``name`` took ``wall`` s on the driver; ``results`` are the workers' reports."""
        self.stages[name] = self.stages.get(name, 0.0) + wall
        busy = max((r.get("busy_s", 0.0) for r in results), default=0.0)
        self.busy[name] = self.busy.get(name, 0.0) + busy
        self.dock_s += max((r.get("dock_s", 0.0) for r in results), default=0.0)
        self.reshard_s += max((r.get("reshard_s", 0.0) for r in results), default=0.0)
        self.handover_bytes += sum(r.get("handover_bytes", 0.0) for r in results)
        self.scheduling_s += max(wall - busy, 0.0)
        book_peaks(self.memory, name, results)

    def add_streamed(self, name: str, stage: StreamedStage, generation_end: float) -> None:
        """A streamed stage: its wall time is what it ran on after generation ended."""
        tail = max(stage.finished_at - generation_end, 0.0)
        self.stages[name] = self.stages.get(name, 0.0) + tail
        self.busy[name] = self.busy.get(name, 0.0) + stage.busy_s
        self.overlap[name] = self.overlap.get(name, 0.0) + stage.overlap_s
        self.dock_s += stage.dock_s
        self.scheduling_s += max(tail - (stage.busy_s - stage.overlap_s), 0.0)
        book_peaks(self.memory, name, stage.results)

    def overhead(self, iteration_s: float) -> dict[str, float]:
        total = self.dock_s + self.reshard_s + self.scheduling_s
        beside = {"dock_beside_s": self.dock_beside_s} if self.dock_beside_s else {}
        return {
            "dock_s": self.dock_s,
            "reshard_s": self.reshard_s,
            "scheduling_s": self.scheduling_s,
            "share": total / iteration_s,
        } | beside


@dataclass
class Sampled:
    """What the generate / reward / filter loop produced this iteration."""

    kept: list[int] = field(default_factory=list)  # group slots trained on
    draws: int = 0
    samples: int = 0
    reward_sum: float = 0.0
    response_tokens: float = 0.0
    prompt_tokens: float = 0.0
    #: A multi-turn run's episode figures, summed over ranks and draws (``env_*`` keys
    #: of the rollout's reports; the wall times, wait and engine, of the slowest rank).
    episodes: dict[str, float] = field(default_factory=dict)
    #: The reward stage's reports: per-domain rewards, per-function outcomes, failures.
    rewards: RewardBook = field(default_factory=RewardBook)

    def book_episodes(self, reports: list[dict]) -> None:
        """Add the actor ranks' rollout reports of one draw."""
        for key in {k for r in reports for k in r if k.startswith("env_")}:
            values = [r[key] for r in reports if key in r]
            once = max(values) if key in EPISODE_WALL_TIMES else sum(values)
            self.episodes[key] = self.episodes.get(key, 0.0) + once


#: Rollout report keys that are a rank's wall time (ranks run in parallel: the slowest
#: rank's counts), not a sum over its episodes.
EPISODE_WALL_TIMES = frozenset({"env_wait_s", "env_engine_s"})

#: Report keys that are timing or memory, booked by the ledger, not metrics of the iteration.
TIMING_KEYS = (
    frozenset({"busy_s", "dock_s", "reshard_s", "swap_in_s", "handover_bytes"}) | MEMORY_KEYS
)

#: The stage whose controller a checkpoint asks for the versions of responses it keeps.
VERSION_STAGE = "update"


@dataclass
class InFlightState:
    """What a checkpoint keeps of the samples a later iteration trains on:
    the runner's small ``bookkeeping`` (plain data, in the driver's position) and the
    dock ``slices`` whose payloads actor rank 0 writes into its step folder."""

    bookkeeping: dict[str, Any]
    slices: list[DockSlice]


class BatchSource:
    """The part of a runner that varies with the run's kind (``RunPlan.runner``): where an
    iteration's batch comes from, what overlaps training, and what the dock keeps after
    the update. The runner (:class:`IterationRunner`) runs the rest, the same for every
    kind: the scoring stages the source did not run, advantages, the updates, the record.

    This base is the no-op of each step; a source defines the ones its kind needs. Its
    ``runner`` gives it the shared steps (puts, claims, generation calls, scoring).
    """

    #: Scoring stages claim whole groups only (partial rollout: a group whose other
    #: responses are paused is not scored yet). Off here: every group is whole.
    whole_group_claims = False
    #: Scoring stages the source ran itself while the batch generated (streamed): the
    #: runner does not run them again.
    scored: tuple[str, ...] = ()

    def __init__(self, runner: IterationRunner) -> None:
        self.runner = runner

    def draw(self, iteration: int, ledger: Ledger) -> Sampled:
        """The batch of ``iteration``: generated and rewarded, its group slots ``kept``."""
        raise NotImplementedError

    def beside_training(self, iteration: int, ledger: Ledger) -> None:
        """Once every scoring stage claimed the batch: start what may overlap training."""

    def before_update(self, indexes: np.ndarray, iteration: int) -> dict[str, Any]:
        """Checks and record fields of the trained samples, taken before the update."""
        return {}

    def release(self, ledger: Ledger, trained: np.ndarray) -> None:
        """After the update: free the dock for the next iteration (here: nothing in it
        outlives this one)."""
        self.runner.timed_dock(ledger, self.runner.run.dock.clear)

    def after_update(self, iteration: int, ledger: Ledger) -> None:
        """After the release: start what overlaps the next iteration, book what ran beside."""

    def counts(self, sampled: Sampled) -> dict[str, Any]:
        """The record fields of this kind of run (after the common ones)."""
        return {}

    def record(
        self, metrics: dict[str, Any], sampled: Sampled, ledger: Ledger, seconds: float
    ) -> dict[str, Any]:
        """The iteration's metrics record from the updates' ``metrics`` (here: the RL
        record, :meth:`IterationRunner.rl_record`, with this kind's counts)."""
        return self.runner.rl_record(metrics, sampled, ledger, seconds) | self.counts(sampled)

    def in_flight_state(self) -> InFlightState | None:
        """Between iterations: the samples in the dock a later iteration trains on, for a
        checkpoint; None when there are none (here: every iteration empties the dock)."""
        return None

    def restore_in_flight(self, bookkeeping: dict[str, Any]) -> None:
        """Resume from a checkpoint whose samples in flight are back in the dock. A run
        that keeps nothing in flight (its config changed since) drops them."""
        print_progress_line("resume: this run keeps no samples in flight; dropping the saved ones")
        self.runner.run.dock.clear()


class OnlineSource(BatchSource):
    """The online RL loop's batch on the actor ranks: prompts -> responses -> rewards
    (-> DAPO's filter and refills), in sync mode or with the streaming stages taking the
    samples as they come (``dock.pipeline: stream``)."""

    def __init__(self, runner: IterationRunner) -> None:
        super().__init__(runner)
        run = runner.run
        stream = runner.config.dock.pipeline == "stream"
        streamed = runner.plan.streaming_stages(bool(run.options.dynamic_sampling))
        self.scored = streamed if stream else ()
        self.stream = StreamScheduler(run, self.scored, runner.timeout) if stream else None

    def draw(self, iteration: int, ledger: Ledger) -> Sampled:
        runner, run = self.runner, self.runner.run
        sampled = Sampled()
        free = list(range(runner.G * runner.plan.sample_batches))
        limit = run.options.max_sample_batches
        while True:
            slots, free = free[: runner.G], free[runner.G :]
            indexes = runner.indexes(slots)
            batch = run.dataset.next_batch(len(slots))
            runner.put_prompts(ledger, indexes, batch, sampled)
            if self.stream is not None:
                scored = self._generate_streaming(
                    ledger, indexes, iteration, sampled.draws, sampled
                )
            else:
                generated = runner.stage(
                    ledger, "rollout", self.generate, indexes, iteration, sampled.draws
                )
                sampled.book_episodes(generated)
                scored = runner.stage(ledger, "reward", runner.score_stage, "reward", indexes)
            sampled.draws += 1
            sampled.samples += len(indexes)
            sampled.reward_sum += sum(r["reward_sum"] for r in scored)
            sampled.response_tokens += sum(r["response_tokens"] for r in scored)
            failed = runner.book_rewards(sampled, scored)
            kept = self._filter(ledger, slots) if run.options.dynamic_sampling else slots
            kept = runner.drop_groups(ledger, kept, failed)
            sampled.kept += kept
            free += [s for s in slots if s not in kept]
            if len(sampled.kept) >= runner.G or (limit and sampled.draws >= limit):
                break
            if sampled.draws % DRAWS_BETWEEN_NOTES == 0:
                print_progress_line(
                    f"dynamic sampling: {sampled.draws} batches drawn, {len(sampled.kept)}/"
                    f"{runner.G} groups with differing rewards kept so far"
                )
        sampled.kept = runner.trim(ledger, sampled.kept)
        return sampled

    def generate(self, indexes: np.ndarray, iteration: int, draw: int) -> list[dict]:
        """Generate the batch of ``indexes`` on the actor ranks; their reports."""
        return self.runner.generate(
            self.runner.generation_args(indexes, iteration, draw), len(indexes)
        )

    def _generate_streaming(
        self, ledger: Ledger, indexes: np.ndarray, iteration: int, draw: int, sampled: Sampled
    ) -> list[dict]:
        """Generation with the streaming stages taking its samples as they come (see
        trainers/driver/streaming.py); returns the reward workers' reports."""
        start = time.perf_counter()
        args = self.runner.generation_args(indexes, iteration, draw)
        with self.runner.progress(len(indexes)) as progress:
            outcome = self.stream.run_batch(args, len(indexes), progress)
        ledger.add_stage("rollout", outcome.generation_end - start, outcome.generated)
        sampled.book_episodes(outcome.generated)
        for name, stage in outcome.stages.items():
            ledger.add_streamed(name, stage, outcome.generation_end)
        return outcome.stages["reward"].results

    def _filter(self, ledger: Ledger, slots: list[int]) -> list[int]:
        """DAPO: keep groups whose rewards differ; free the others' indexes for a refill."""
        runner = self.runner
        start = time.perf_counter()
        (kept,) = runner.run.groups["reward"].call(
            "keep", runner.indexes(slots), stage="filter", timeout_s=runner.timeout, ranks=[0]
        )
        kept_slots = sorted(set(group_slots(kept, runner.N).tolist()))
        dropped = [s for s in slots if s not in kept_slots]
        if dropped:
            runner.run.dock.recycle(runner.indexes(dropped))
        ledger.add_stage("filter", time.perf_counter() - start, [])
        return kept_slots


class IterationRunner:
    """Runs iterations of one started run (see module docstring), its batches drawn by a
    :class:`BatchSource` of the run's kind (trainers/driver/runners.py picks it).

    Args:
        run: the started run.
        source: makes the batch source, given the runner (default: the online loop's).
        pair_size: offline pairs: the update claims whole pairs of this many samples per
            data-parallel rank, in pair order (the online claim balances single samples
            by length, which could part a pair); None for the online claim.
    """

    def __init__(
        self,
        run: RunState,
        source: Callable[[IterationRunner], BatchSource] = OnlineSource,
        pair_size: int | None = None,
    ) -> None:
        self.run, self.config = run, run.config
        self.G = self.config.data.global_batch_size
        self.N = self.config.data.n_samples_per_prompt if pair_size is None else pair_size
        self.plan = run.plan
        self.timeout = self.plan.stage_deadline_s
        self.pair_size = pair_size
        reward = self.config.reward
        self.failures = FailureWindow(reward.on_failure, reward.max_failure_fraction)
        #: Each stage's largest memory peaks over the whole run (the end-of-run check
        #: against the planner, mindrl.planner.check).
        self.stage_peaks: dict[str, dict[str, float]] = {}
        self.source = source(self)

    # ---- the iteration -------------------------------------------------------------------
    def run_iteration(self, iteration: int) -> dict[str, Any]:
        """One iteration; returns its metrics record."""
        start = time.perf_counter()
        ledger = Ledger()
        sampled = self.source.draw(iteration, ledger)
        self.failures.check(sampled.rewards)  # before anything trains on the batch
        indexes = self.indexes(sampled.kept)
        metrics: dict[str, Any] = {}
        checked: dict[str, Any] = {}
        if len(indexes):
            self._score_stages(indexes, ledger)
            self.source.beside_training(iteration, ledger)
            if "advantage" in self.plan.stage_names and "advantage" not in self.source.scored:
                self.stage(ledger, "advantage", self._advantages, indexes)
            checked = self.source.before_update(indexes, iteration)
            metrics |= mean_by_key(
                self.stage(ledger, "update", self._update, indexes), skip=TIMING_KEYS
            )
            if self.plan.needs_critic:
                critic = self.stage(ledger, "critic_update", self._critic_update, indexes)
                metrics |= mean_by_key(critic, skip=TIMING_KEYS)
            self.run.kl.update(metrics.get("kl", 0.0), len(indexes))
        self.source.release(ledger, indexes)
        self.source.after_update(iteration, ledger)
        return self.source.record(metrics, sampled, ledger, time.perf_counter() - start) | checked

    # ---- checkpoints: what outlives an iteration -------------------------------------------
    def in_flight_state(self) -> InFlightState | None:
        """Between iterations: the samples in the dock a later iteration trains on, for a
        checkpoint (the source's); None when there are none."""
        return self.source.in_flight_state()

    def restore_in_flight(self, bookkeeping: dict[str, Any]) -> None:
        """Resume from a checkpoint whose samples in flight are back in the dock."""
        self.source.restore_in_flight(bookkeeping)

    def reclaim_prompts(self, indexes: np.ndarray) -> None:
        """The rollout stage claimed the prompts of ``indexes`` before the checkpoint; claim
        them again once they are back in the dock, so the next claim takes fresh ones."""
        (taken,) = self.run.dock.claim(
            "rollout", ["prompt_ids"], len(indexes), whole_groups=True, timeout_s=self.timeout
        )
        if not np.array_equal(np.sort(taken), np.sort(indexes)):
            raise DockError(
                f"resume: the rollout stage found prompts at {np.sort(taken).tolist()[:8]} "
                f"where the checkpoint put back {np.sort(indexes).tolist()[:8]}"
            )

    # ---- steps every source shares -----------------------------------------------------------
    def stage(self, ledger: Ledger, name: str, fn, *args) -> list[dict[str, Any]]:
        """Run a stage, book its time; returns every worker's report."""
        start = time.perf_counter()
        results = fn(*args)
        ledger.add_stage(name, time.perf_counter() - start, results)
        return results

    def timed_dock(self, ledger: Ledger, fn, *args, **kwargs):
        """Call the dock (``fn``), its time booked as dock time."""
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        ledger.dock_s += time.perf_counter() - start
        return out

    def indexes(self, slots: list[int]) -> np.ndarray:
        """The sample indexes of group ``slots``."""
        return slot_indexes(slots, self.N)

    def put_prompts(
        self, ledger: Ledger, indexes: np.ndarray, batch: PromptBatch, sampled: Sampled
    ) -> None:
        """A group's prompt goes into the dock once for its N responses (``repeat``): the
        driver's node would otherwise send every remote warehouse N copies of it."""
        prompts = [np.asarray(p, dtype=np.int64) for p in batch.prompt_ids]
        groups = group_slots(indexes[:: self.N], self.N)  # the dock's slot is the group
        sampled.prompt_tokens += float(self.N * sum(len(p) for p in prompts))
        fields = {"prompt_ids": prompts, **record_fields(batch.records), GROUP_ID: groups}
        self.timed_dock(ledger, self.run.dock.put, indexes, fields, repeat=self.N)

    def book_rewards(self, sampled: Sampled, reports: list[dict]) -> list[int]:
        """Book a reward stage's ``reports`` in ``sampled``; the group slots to drop: each
        holding a sample whose reward failed, where ``reward.on_failure`` is drop_group (a
        failure then never enters a group baseline as a 0)."""
        sampled.rewards.add(reports)
        if self.config.reward.on_failure != "drop_group":
            return []
        failed = [np.asarray(r.get("failed", ()), dtype=np.int64) for r in reports]
        indexes = np.concatenate(failed) if failed else np.zeros(0, dtype=np.int64)
        slots = sorted(set(group_slots(indexes, self.N).tolist()))
        sampled.rewards.dropped_groups += len(slots)
        return slots

    def drop_groups(self, ledger: Ledger, kept: list[int], dropped: list[int]) -> list[int]:
        """``kept`` without the ``dropped`` group slots, whose samples leave the dock."""
        gone = [slot for slot in kept if slot in set(dropped)]
        if gone:
            self.timed_dock(ledger, self.run.dock.recycle, self.indexes(gone))
        return [slot for slot in kept if slot not in set(dropped)]

    def trim(self, ledger: Ledger, kept: list[int]) -> list[int]:
        """At most G groups, and a sample count every data-parallel group size divides
        (the surplus leaves the dock)."""
        sizes = [self.run.dp_size(role) for role in self.run.dp_ranks]
        step = int(np.lcm.reduce([*sizes, 1]))
        count = min(len(kept), self.G)
        while count and (count * self.N) % step:
            count -= 1
        surplus = kept[count:]
        if surplus:
            self.timed_dock(ledger, self.run.dock.recycle, self.indexes(surplus))
        return kept[:count]

    def generate(self, args: list[tuple], n: int) -> list[dict]:
        """Each actor rank's ``generate`` with its ``args``, a progress bar over ``n``."""
        with self.progress(n) as progress:
            return self.run.groups["actor"].call_each(
                "generate", args, stage="rollout", timeout_s=self.timeout, on_poll=progress
            )

    def generation_args(self, indexes: np.ndarray, iteration: int, draw: int) -> list[tuple]:
        """Claim the prompts; each actor rank's ``generate`` arguments."""
        parts = self.claim_prompts(len(indexes))
        params = self.sampling_params(iteration, draw)
        return [(parts[r], params) for r in self.run.gen_dp_ranks]

    def claim_prompts(self, n: int) -> list[np.ndarray]:
        """``n`` prompts in whole groups from the rollout stage, one part per generation
        data-parallel rank."""
        return self.run.dock.claim(
            "rollout",
            ["prompt_ids"],
            n,
            whole_groups=True,
            dp_parts=len(set(self.run.gen_dp_ranks)),
            timeout_s=self.timeout,
            part_warehouses=self.run.generation_warehouses(),
        )

    def sampling_params(self, iteration: int, draw: int) -> SamplingParams:
        """Sampling settings of one draw, seeded by the run's seed, iteration and draw."""
        rollout = self.config.rollout
        seed = int(np.random.SeedSequence([self.config.seed, iteration, draw]).generate_state(1)[0])
        return SamplingParams(
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            top_k=max(rollout.top_k, 0),
            max_tokens=rollout.max_response_length,
            stop_token_ids=(self.run.dataset_eos,),
            seed=seed,
        )

    @contextmanager
    def progress(self, n: int) -> Iterator[Callable[[], None] | None]:
        """A progress bar over ``n`` generated samples; yields its updater (or None)."""
        dock = self.run.dock
        before = dock.ready_count("reward", ["response_ids"])
        bar = generation_progress(n, self.config.logging.progress_bar)

        def progress() -> None:
            bar.n = dock.ready_count("reward", ["response_ids"]) - before
            bar.refresh()

        with bar:
            yield progress if self.config.logging.progress_bar else None

    def score_stage(self, name: str, indexes: np.ndarray) -> list[dict]:
        """A scoring stage on the whole batch at once (sync mode)."""
        call = stage_call(self.run, self.plan.stage(name))
        whole = self.source.whole_group_claims or call.whole_groups
        parts = self.run.dock.claim(
            name, call.fields, len(indexes), whole, call.dp_parts, self.timeout,
            part_warehouses=call.part_warehouses,
        )  # fmt: skip
        args = call.args(parts)
        return call.group.call_each(
            "score", list(args.values()), stage=name, timeout_s=self.timeout, ranks=list(args)
        )

    # ---- scoring, advantages, updates --------------------------------------------------------
    def _score_stages(self, indexes: np.ndarray, ledger: Ledger) -> None:
        for name in self.plan.scoring_stages():
            if name not in self.source.scored:
                self.stage(ledger, name, self.score_stage, name, indexes)

    def _by_dp_rank(self, stage: str, role: str, fields: list[str], n: int) -> list:
        if self.pair_size is not None:
            (taken,) = self.run.dock.claim(
                stage, fields, n, whole_groups=True, timeout_s=self.timeout
            )
            parts = split_whole_pairs(taken, self.run.dp_size(role), self.pair_size)
            return self.run.per_worker(role, parts)
        dp_parts = self.run.dp_size(role)
        parts = self.run.dock.claim(
            stage, fields, n, dp_parts=dp_parts, timeout_s=self.timeout,
            part_warehouses=self.run.part_warehouses(role),
        )  # fmt: skip
        return self.run.per_worker(role, parts)

    def _advantages(self, indexes: np.ndarray) -> list[dict]:
        fields = list(self.plan.stage("advantage").reads)
        (claimed,) = self.run.dock.claim(
            "advantage", fields, len(indexes), whole_groups=True, timeout_s=self.timeout
        )
        parts = advantage_parts(self.run, claimed)
        return self.run.groups["reward"].call_each(
            "advantages",
            [(part,) for part in parts.values()],
            stage="advantage",
            timeout_s=self.timeout,
            ranks=list(parts),
        )

    def _minibatches(self, indexes: np.ndarray, role: str) -> int:
        prompts = len(indexes) // self.N
        per_step = getattr(self.config, role).mini_batch_size or self.G
        return max(-(-prompts // per_step), 1)

    def _update(self, indexes: np.ndarray) -> list[dict]:
        options = replace(self.run.options, kl_coef=self.run.kl.value)
        return self._train("update", indexes, options)

    def _critic_update(self, indexes: np.ndarray) -> list[dict]:
        return self._train("critic_update", indexes)

    def _train(
        self, name: str, indexes: np.ndarray, options: AlgorithmConfig | None = None
    ) -> list[dict]:
        """A training stage: its role's data-parallel ranks each claim a share of
        ``indexes`` and train on it (the worker fetches what the stage reads)."""
        stage = self.plan.stage(name)
        parts = self._by_dp_rank(name, stage.role, list(stage.reads), len(indexes))
        steps = self._minibatches(indexes, stage.role)
        return self.run.groups[stage.role].call_each(
            "update", [(p, name, steps, options) for p in parts], stage=name,
            timeout_s=self.timeout,
        )  # fmt: skip

    # ---- the record --------------------------------------------------------------------------
    def rl_record(
        self, metrics: dict[str, Any], sampled: Sampled, ledger: Ledger, seconds: float
    ) -> dict[str, Any]:
        """An online iteration's record: rewards, lengths, the updates' ``metrics``, the
        KL coefficient, throughput, the stages' times, overhead and memory."""
        n = max(sampled.samples, 1)
        prompt_len, response_len = sampled.prompt_tokens / n, sampled.response_tokens / n
        record = {
            "reward_mean": sampled.reward_sum / n,
            "response_length_mean": response_len,
            "prompt_length_mean": prompt_len,
            **metrics,
            "kl_coef": self.run.kl.value,
            **sampled.rewards.metrics(),
            "tps": self._tps(sampled, prompt_len, response_len, seconds),
            "iteration_time_s": seconds,
            "time": ledger.stages,
            "busy": ledger.busy,
            "overlap": {**ledger.overlap, "total": sum(ledger.overlap.values(), 0.0)},
            "overhead": ledger.overhead(seconds),
            "handover_bytes": ledger.handover_bytes,
            MEMORY_RECORD_KEY: self.memory_record(ledger),
        }
        if self.run.options.dynamic_sampling:
            record |= {"sample_batches": sampled.draws, "kept_groups": len(sampled.kept)}
        if sampled.episodes:
            record |= episode_metrics(sampled.episodes, seconds)
        return record

    def memory_record(self, ledger: Ledger) -> dict[str, dict[str, float]]:
        """The iteration's peaks per role; each stage's also raise the run's largest."""
        for stage, peaks in ledger.memory.items():
            book_peaks(self.stage_peaks, stage, [peaks])
        return peaks_by_role(ledger.memory, self.plan.stage_roles())

    def _tps(self, sampled: Sampled, prompt_len: float, response_len: float, seconds: float):
        prompts = sampled.samples // self.N
        world = self.config.world_size
        return tokens_per_second(prompts, self.N, prompt_len, response_len, world, seconds)


def episode_metrics(totals: dict[str, float], seconds: float) -> dict[str, float]:
    """A multi-turn iteration's episode figures (docs/architecture.md §12) from
    the ranks' summed reports: per episode, per step, and the share of the iteration the
    rollout spent waiting on environment steps (the engine idle)."""
    episodes = max(totals["env_episodes"], 1.0)
    return {
        "env_turns_mean": totals["env_turns"] / episodes,
        "env_observation_tokens_mean": totals["env_observation_tokens"] / episodes,
        "env_step_s_mean": totals["env_step_s"] / max(totals["env_steps"], 1.0),
        "env_step_queue_s_mean": totals["env_step_queue_s"] / max(totals["env_steps"], 1.0),
        "env_wait_s": totals["env_wait_s"],
        "env_wait_share": totals["env_wait_s"] / seconds,
        "env_engine_s": totals["env_engine_s"],
        "env_truncated_max_turns": totals["env_truncated_max_turns"],
        "env_truncated_context": totals["env_truncated_context"],
    }


def split_whole_pairs(indexes: np.ndarray, parts: int, pair_size: int = 2) -> list[np.ndarray]:
    """``indexes`` (pairs adjacent) as ``parts`` contiguous runs of whole pairs, in order.

    Raises:
        ValueError: the pairs do not split evenly (the config check refuses such sizes).
    """
    pairs = len(indexes) // pair_size
    if len(indexes) % pair_size or pairs % parts:
        raise ValueError(f"{len(indexes)} samples are not {parts} equal runs of whole pairs")
    return list(np.split(np.asarray(indexes, dtype=np.int64), parts))
