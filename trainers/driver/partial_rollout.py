"""Iterations with partial rollout (``rollout.partial_rollout_budget``).

A generation *round* gives every response at most ``budget`` new tokens, so the longest
responses no longer hold the batch. A response still unfinished when its budget runs out
is paused: its tokens and their log-probs stay in the dock (``paused_ids`` /
``paused_logprob``, mindrl/workers/generation.py) and the next round continues it from
exactly that prefix with the weights of that round's iteration. A group is finished once
all its responses are.

The dock keeps a pool of ``P`` group slots in flight (``rollout.partial_rollout_groups``,
default ``2G``; the dock is sized to it, mindrl/run_plan.py ``dock_groups``), so one
batch can finish while long responses stay paused. Each iteration runs rounds until at
least ``G`` groups are finished; a round first puts fresh prompts into free slots, as
many as finished groups are still missing (at most the free slots;
``rollout.partial_rollout_refill: missing``, the default) or into every free slot
(``pool``: the pool stays full, so a steady long tail needs one round per iteration and
the update mostly trains groups that finished an iteration earlier), then continues
every paused response and generates the fresh ones. The update trains exactly the ``G``
*oldest* finished groups (by the order their prompts were drawn, so none waits forever);
the other finished groups are held out of every stage's claims (``DockClient.hold``)
and, with the paused ones, carried over to the next iteration.

Rounds per iteration are capped at ``ceil(max_response_length / budget)``: every group in
the dock after the first round's refill (at least ``G``: the refill tops the finished up
to ``G`` unless the pool is full, and ``P >= G``) has finished by then, since each round
gives each unfinished response its budget or its rest. So the cap only bounds the loop;
were it ever reached short of ``G`` (an engine that stopped early without saying so), the
iteration trains the finished groups it has and ``trained_groups`` says how many.

Every token's ``rollout_logprob`` is the one of the weights that sampled it, so a response
continued across updates, or a finished group that waited for an update, carries its
behaviour policy token by token and the loss corrects each token for its lag
(trainers/core.py, ``behaviour_weights``; the update's behaviour log-probs are the
rollout's whenever partial rollout is on, mindrl/run_plan.py, ``tokens_may_lag``).

With a budget no response reaches (``>= rollout.max_response_length``) the first round
finishes the ``G`` fresh groups in slots ``0 .. G-1`` and nothing is carried, so a run
trains exactly as without partial rollout: the same prompts, calls and seeds.

A checkpoint between iterations keeps every group in flight (``in_flight_state``):
the flights, paused indexes and draw count in the driver's position, their samples in
actor rank 0's step folder; a resumed run restores both and continues them exactly
(docs/pipeline.md, "Partial rollout").
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from typing import Any

import numpy as np

from mindrl.data import PromptBatch
from mindrl.dock import DockSlice, group_slots
from mindrl.run_plan import PROMPT_FIELDS, partial_rollout_groups
from mindrl.workers.generation import PAUSED_FIELDS, RESPONSE_FIELDS, PartialRollout
from trainers.driver.iteration import (
    VERSION_STAGE,
    BatchSource,
    InFlightState,
    IterationRunner,
    Ledger,
    Sampled,
)


@dataclass(frozen=True)
class Flight:
    """A group in the dock: when its prompt was drawn, and the prompt's length."""

    order: int  # draws over the run before it: the lower, the older
    iteration: int  # the iteration whose round drew it
    prompt_tokens: int


class FlightPool:
    """The groups in the dock not trained yet, over iterations, in a pool of ``size``
    group slots: their draw order, their paused responses, the finished ones held back,
    and what a checkpoint keeps of them. Partial rollout's rounds and the continuous
    source (trainers/driver/continuous.py) each keep one."""

    def __init__(self, runner: IterationRunner, size: int) -> None:
        self.runner, self.size, self.N = runner, size, runner.N
        #: Slot -> the group in it, for every group in the dock not trained yet.
        self.flights: dict[int, Flight] = {}
        #: Sample indexes whose response is paused in the dock.
        self.paused = np.zeros(0, dtype=np.int64)
        #: Finished groups held out of this iteration's claims, given back after it.
        self.held: list[int] = []
        #: The groups this iteration's update trained, once their slots are freed.
        self.trained: list[Flight] = []
        self.drawn = 0  # groups drawn over the run
        self.drawn_before = 0  # ... before this iteration

    def board(self, slots: list[int], batch: PromptBatch, iteration: int) -> None:
        """The groups of ``batch``'s prompts, drawn now, into ``slots``."""
        for slot, ids in zip(slots, batch.prompt_ids, strict=True):
            self.flights[slot] = Flight(self.drawn, iteration, len(ids))
            self.drawn += 1

    def finished(self) -> list[int]:
        """Slots whose group has every response finished (none paused), ascending."""
        waiting = set(group_slots(self.paused, self.N).tolist())
        return sorted(slot for slot in self.flights if slot not in waiting)

    def free(self) -> list[int]:
        """Slots of the pool with no group in them, ascending."""
        return [slot for slot in range(self.size) if slot not in self.flights]

    def in_flight_state(self, unfinished: np.ndarray) -> InFlightState | None:
        """Every group not trained yet: the prompts, the paused responses' prefixes and the
        finished responses (all but ``unfinished``) in the dock, and the flights, paused
        indexes and draw count."""
        if not self.flights:
            return None
        indexes = self.runner.indexes(sorted(self.flights))
        finished = np.setdiff1d(indexes, unfinished)
        bookkeeping = {
            "flights": [[slot, *astuple(flight)] for slot, flight in sorted(self.flights.items())],
            "paused": self.paused.tolist(),
            "drawn": self.drawn,
        }
        slices = [
            DockSlice(indexes, PROMPT_FIELDS),
            DockSlice(self.paused, PAUSED_FIELDS),
            DockSlice(finished, RESPONSE_FIELDS, VERSION_STAGE),
        ]
        return InFlightState(bookkeeping, slices)

    def restore(self, bookkeeping: dict[str, Any]) -> None:
        """The groups a checkpoint kept in flight, back as they were after its iteration
        (their samples are in the dock again; their prompts were claimed when drawn)."""
        self.flights = {slot: Flight(*rest) for slot, *rest in bookkeeping["flights"]}
        self.paused = np.asarray(bookkeeping["paused"], dtype=np.int64)
        self.drawn = bookkeeping["drawn"]
        self.runner.reclaim_prompts(self.runner.indexes(sorted(self.flights)))


class PartialRolloutSource(BatchSource):
    """Batches of budgeted generation rounds over a pool of groups in flight (module
    docstring)."""

    whole_group_claims = True

    def __init__(self, runner: IterationRunner) -> None:
        super().__init__(runner)
        self.G, self.N, self.config = runner.G, runner.N, runner.config
        rollout = self.config.rollout
        self.budget: int | None = rollout.partial_rollout_budget
        self.pool = FlightPool(runner, partial_rollout_groups(self.config))
        self.max_rounds = -(-rollout.max_response_length // self.budget) if self.budget else 0
        #: Fresh prompts into every free slot (``pool``), or only as many as missing.
        self.fill_pool = rollout.partial_rollout_refill == "pool"
        self.iteration = 0  # the one running

    # ---- sampling: rounds until G groups finished ------------------------------------------
    def draw(self, iteration: int, ledger: Ledger) -> Sampled:
        """Generation rounds until ``G`` groups finished; keeps the oldest ``G``, holds the
        other finished ones for a later update and scores the kept."""
        runner = self.runner
        sampled = Sampled()
        self.iteration, self.pool.drawn_before = iteration, self.pool.drawn
        finished = self.pool.finished()
        while len(finished) < self.G and sampled.draws < self.max_rounds:
            free = self.pool.free()
            fresh = free if self.fill_pool else free[: self.G - len(finished)]
            self._round(ledger, sampled, fresh, iteration)
            finished = self.pool.finished()
        sampled.kept = sorted(finished, key=lambda slot: self.pool.flights[slot].order)[: self.G]
        self.pool.held = sorted(set(finished) - set(sampled.kept))
        if self.pool.held:
            runner.timed_dock(ledger, runner.run.dock.hold, runner.indexes(self.pool.held))
        if sampled.kept:
            indexes = runner.indexes(sampled.kept)
            scored = runner.stage(ledger, "reward", runner.score_stage, "reward", indexes)
            sampled.samples = len(indexes)
            sampled.reward_sum = sum(r["reward_sum"] for r in scored)
            sampled.response_tokens = sum(r["response_tokens"] for r in scored)
            self._drop(ledger, sampled, runner.book_rewards(sampled, scored))
        # Per trained sample, as the record's means are: prompts put now may train later.
        prompt_tokens = sum(self.pool.flights[slot].prompt_tokens for slot in sampled.kept)
        sampled.prompt_tokens = float(prompt_tokens * self.N)
        return sampled

    def _drop(self, ledger: Ledger, sampled: Sampled, dropped: list[int]) -> None:
        """Take the groups whose reward failed out of the batch and the pool (their slots
        take fresh prompts in a later round), and trim what is left to the data-parallel
        sizes."""
        if not dropped:
            return
        kept = self.runner.drop_groups(ledger, sampled.kept, dropped)
        sampled.kept = self.runner.trim(ledger, kept)
        for slot in set(kept) - set(sampled.kept) | set(dropped):
            self.pool.flights.pop(slot, None)

    def _round(self, ledger: Ledger, sampled: Sampled, fresh: list[int], iteration: int) -> None:
        """Fresh prompts into ``fresh`` slots, then one budget's worth of tokens for them
        and every paused response (seeded by the round, as a draw is)."""
        runner = self.runner
        if fresh:
            batch = runner.run.dataset.next_batch(len(fresh))
            runner.put_prompts(ledger, runner.indexes(fresh), batch, sampled)
            self.pool.board(fresh, batch, iteration)
        indexes = runner.indexes(fresh)
        reports = runner.stage(ledger, "rollout", self.generate, indexes, iteration, sampled.draws)
        self.pool.paused = np.unique(np.concatenate([r["paused"] for r in reports]))
        sampled.draws += 1

    def generate(self, indexes: np.ndarray, iteration: int, draw: int) -> list[dict]:
        """One round on the actor ranks: the fresh prompts of ``indexes`` and every paused
        response; their reports."""
        return self.runner.generate(self._generation_args(indexes, iteration, draw), len(indexes))

    def _generation_args(self, indexes: np.ndarray, iteration: int, draw: int) -> list[tuple]:
        """The fresh prompts as the rollout stage splits them, plus the paused responses
        dealt round-robin over the generation ranks; each rank's ``generate`` arguments."""
        run = self.runner.run
        ranks = len(set(run.gen_dp_ranks))
        if len(indexes):
            parts = self.runner.claim_prompts(len(indexes))
        else:
            parts = [np.zeros(0, dtype=np.int64)] * ranks
        paused = self.pool.paused
        parts = [np.sort(np.concatenate([p, paused[r::ranks]])) for r, p in enumerate(parts)]
        partial = PartialRollout(
            self.budget, self.config.rollout.max_response_length, paused, draw > 0, iteration
        )
        params = self.runner.sampling_params(iteration, draw)
        return [(parts[r], params, partial) for r in run.gen_dp_ranks]

    # ---- after the update ---------------------------------------------------------------------
    def release(self, ledger: Ledger, trained: np.ndarray) -> None:
        """Free only the trained groups' slots; the held ones may be claimed again."""
        runner = self.runner
        slots = np.unique(group_slots(trained, self.N)).tolist()
        self.pool.trained = [self.pool.flights.pop(slot) for slot in slots]
        if len(trained):
            runner.timed_dock(ledger, runner.run.dock.recycle, trained)
        if self.pool.held:
            runner.timed_dock(ledger, runner.run.dock.hold, runner.indexes(self.pool.held), False)

    # ---- checkpoints: the groups in flight ----------------------------------------------------
    def in_flight_state(self) -> InFlightState | None:
        """Every group not trained yet (the pool's); a paused response keeps its prefix."""
        return self.pool.in_flight_state(self.pool.paused)

    def restore_in_flight(self, bookkeeping: dict[str, Any]) -> None:
        """The groups a checkpoint kept, back in the pool as they were."""
        self.pool.restore(bookkeeping)

    def counts(self, sampled: Sampled) -> dict[str, Any]:
        """What this iteration's rounds did and left in the dock."""
        return {
            "trained_groups": len(self.pool.trained),
            "paused_responses": len(self.pool.paused),
            "generation_rounds": sampled.draws,
            "drawn_groups": self.pool.drawn - self.pool.drawn_before,
            "carried_groups": len(self.pool.flights),
            "carried_finished_groups": len(self.pool.held),
            # Updates the oldest trained group's first tokens lag behind the trained weights.
            "staleness_max": max(
                (self.iteration - f.iteration for f in self.pool.trained), default=0
            ),
        }
