"""Partial rollout's rounds without Ray: the driver's scheduling (trainers/driver/
partial_rollout.py) over a scripted engine in which every response needs a known number
of tokens and gets at most the budget per round, and a dock that records what is put,
held, given back and recycled.

These pin what the long-tail run on Ray meets only by chance: finished groups held back
for the next update (the oldest train first), and the round cap.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from itertools import pairwise
from types import SimpleNamespace

import numpy as np
import pytest

from backends.megatron.checkpoint import decode, encode
from mindrl.config import ConfigError, load_config
from mindrl.data import PromptBatch, PromptRecord
from mindrl.run_plan import build_run_plan
from trainers.driver.iteration import IterationRunner, Ledger
from trainers.driver.partial_rollout import PartialRolloutSource
from trainers.registry import get_algorithm

G, N, B, LENGTH = 4, 2, 4, 16  # groups per update, responses per group, budget, max length
POOL = 2 * G  # the default in-flight pool
ROUND_CAP = LENGTH // B


@dataclass
class Dock:
    """What the driver asks of the dock (metadata only; the scripted engine keeps the
    tokens)."""

    put: set[int] = field(default_factory=set)
    held: set[int] = field(default_factory=set)
    recycled: list[int] = field(default_factory=list)

    def hold(self, indexes: np.ndarray, held: bool = True) -> None:
        assert set(indexes.tolist()) <= self.put
        change = set(indexes.tolist())
        self.held = self.held | change if held else self.held - change

    def recycle(self, indexes: np.ndarray) -> None:
        assert not set(indexes.tolist()) & self.held  # a held group is never trained now
        self.put -= set(indexes.tolist())
        self.recycled += indexes.tolist()

    def claim(self, stage: str, fields: list[str], n: int, **_: object) -> list[np.ndarray]:
        """Only a resume claims here (the scripted engine takes its prompts itself): every
        prompt the checkpoint put back, which the rollout stage had claimed before."""
        assert (stage, fields, n) == ("rollout", ["prompt_ids"], len(self.put))
        return [np.array(sorted(self.put))]


class Dataset:
    """Prompts numbered as drawn: prompt ``k`` is ``[k]``."""

    def __init__(self) -> None:
        self.records = [SimpleNamespace(uid=str(k)) for k in range(1000)]
        self.drawn = 0

    def next_batch(self, count: int) -> PromptBatch:
        first, self.drawn = self.drawn, self.drawn + count
        ids = list(range(first, self.drawn))
        records = [PromptRecord(str(k), "", "") for k in ids]
        return PromptBatch([[k] for k in ids], records, [""] * count, 0, first)


class ScriptedRounds(PartialRolloutSource):
    """Partial rollout's rounds with the engine replaced: response ``m`` of prompt ``k``
    needs ``needs(k, m)`` tokens; a round gives each response in the dock
    ``min(budget, what it still needs)``."""

    def __init__(self, runner: IterationRunner, needs) -> None:
        super().__init__(runner)
        self.run = runner.run
        self.needs, self.tokens = needs, {}  # index -> tokens so far
        self.prompt_of: dict[int, int] = {}  # slot -> prompt number

    def indexes(self, slots: list[int]) -> np.ndarray:
        return self.runner.indexes(slots)

    def generate(self, indexes, iteration, draw) -> list[dict]:
        assert not set(self.pool.paused.tolist()) & set(indexes.tolist())
        paused = []
        for index in [*indexes.tolist(), *self.pool.paused.tolist()]:
            done = 0 if index in indexes else self.tokens[index]
            need = self.needs(self.prompt_of[index // self.N], index % self.N)
            self.tokens[index] = min(done + self.budget, need)
            if self.tokens[index] < need:
                paused.append(index)
        return [{"paused": np.array(paused, dtype=np.int64), "response_tokens": 0}]


class ScriptedSteps(IterationRunner):
    """The runner's shared steps with the dock's prompt puts and the scoring workers
    replaced (the scripted engine keeps the prompts)."""

    def put_prompts(self, ledger, indexes, batch, sampled) -> None:
        assert not set(indexes.tolist()) & self.run.dock.put  # only free slots
        self.run.dock.put |= set(indexes.tolist())
        for slot, (prompt,) in zip(indexes[:: self.N] // self.N, batch.prompt_ids, strict=True):
            self.source.prompt_of[int(slot)] = prompt

    def score_stage(self, name, indexes) -> list[dict]:
        assert not set(indexes.tolist()) & self.run.dock.held
        return [{"reward_sum": 0.0, "response_tokens": 0}]


def make_runner(needs, *overrides: str) -> ScriptedRounds:
    algorithm = get_algorithm("grpo")
    config = load_config(
        "configs/tiny.yaml",
        [
            f"data.global_batch_size={G}",
            f"data.n_samples_per_prompt={N}",
            f"rollout.max_response_length={LENGTH}",
            f"rollout.partial_rollout_budget={B}",
            *overrides,
        ],
        algorithm=algorithm,
    )
    plan = build_run_plan(algorithm, config)
    run = SimpleNamespace(
        config=config, plan=plan, options=plan.options, dataset=Dataset(), dock=Dock()
    )
    return ScriptedSteps(run, lambda runner: ScriptedRounds(runner, needs)).source


@dataclass
class Step:
    trained: list[int]  # prompt numbers, in the order the update takes them
    held: list[int]
    counts: dict


def iterate(runner: ScriptedRounds, iterations: int, first: int = 0) -> list[Step]:
    """The runner's part of ``run_iteration``: rounds, the update's groups, the release."""
    steps = []
    for iteration in range(first, first + iterations):
        ledger = Ledger()
        sampled = runner.draw(iteration, ledger)
        trained = [runner.prompt_of[slot] for slot in sampled.kept]
        held = sorted(runner.prompt_of[slot] for slot in runner.pool.held)
        assert runner.run.dock.held == set(runner.indexes(runner.pool.held).tolist())
        runner.release(ledger, runner.indexes(sampled.kept))
        assert runner.run.dock.held == set()  # given back for the next iteration's claims
        steps.append(Step(trained, held, runner.counts(sampled)))
    return steps


def longtail(prompt: int, member: int) -> int:
    """1 prompt in 8 wants 13 tokens from every response; the rest 2, except that one
    response in three of the others rambles to 6."""
    if prompt % 8 == 3:
        return 13
    return 6 if (prompt + member) % 3 == 0 else 2


def test_a_long_tail_trains_exactly_g_groups_every_iteration_oldest_first():
    runner = make_runner(longtail)
    steps = iterate(runner, 12)
    assert [s.counts["trained_groups"] for s in steps] == [G] * 12
    assert all(1 <= s.counts["generation_rounds"] <= ROUND_CAP for s in steps)
    assert any(s.held for s in steps)  # finished groups did wait for a later update
    for now, after in pairwise(steps):
        assert now.trained == sorted(now.trained)  # oldest first ...
        if now.held:  # ... before every finished group held back, which trains next
            assert max(now.trained) < min(now.held)
            assert set(now.held) <= set(after.trained)
        assert now.counts["carried_finished_groups"] == len(now.held)
    # Long prompts wait across updates: the first tokens of some trained group were
    # sampled an update or more before the one that trains it.
    assert max(s.counts["staleness_max"] for s in steps) >= 1


def test_no_group_trains_twice_and_every_prompt_drawn_is_trained_or_still_in_the_dock():
    runner = make_runner(longtail)
    steps = iterate(runner, 12)
    trained = [prompt for s in steps for prompt in s.trained]
    assert len(trained) == len(set(trained))
    in_dock = sorted(runner.prompt_of[slot] for slot in runner.pool.flights)
    assert sorted(trained + in_dock) == list(range(runner.run.dataset.drawn))
    assert sum(s.counts["drawn_groups"] for s in steps) == runner.run.dataset.drawn
    assert steps[-1].counts["carried_groups"] == len(in_dock) <= POOL


def test_a_budget_no_response_reaches_draws_g_prompts_into_slots_0_to_g_minus_1_once():
    runner = make_runner(longtail, f"rollout.partial_rollout_budget={LENGTH}")
    for step in iterate(runner, 3):
        counts = step.counts
        assert (counts["generation_rounds"], counts["drawn_groups"]) == (1, G)
        assert (counts["carried_groups"], counts["paused_responses"]) == (0, 0)
    assert runner.run.dock.recycled == list(range(G * N)) * 3  # today's indexes, in order


def test_rounds_stop_at_the_cap_and_the_update_trains_what_finished():
    # An engine that never ends a response it was asked for (one that stopped early
    # without saying so): the cap ends the loop and the record shows the shortfall.
    runner = make_runner(lambda prompt, member: 10**9)
    (step,) = iterate(runner, 1)
    assert step.counts["generation_rounds"] == ROUND_CAP
    assert step.counts["trained_groups"] == 0 and step.trained == []
    assert step.counts["carried_groups"] == POOL  # the pool filled, nothing was lost


def test_a_larger_pool_keeps_more_groups_in_flight():
    runner = make_runner(lambda prompt, member: 10**9, "rollout.partial_rollout_groups=12")
    (step,) = iterate(runner, 1)
    assert step.counts["carried_groups"] == 12
    assert runner.pool.size == 12


def test_refilling_the_pool_keeps_it_full_and_a_steady_long_tail_needs_one_round():
    missing = iterate(make_runner(longtail), 12)
    runner = make_runner(longtail, "rollout.partial_rollout_refill=pool")
    pooled = iterate(runner, 12)
    # Every round fills every free slot: the pool is full when the update starts ...
    assert all(s.counts["carried_groups"] + G == POOL for s in pooled)
    # ... so once the tail is steady no iteration waits a second round for finished
    # groups, where refilling only what is missing needs one for some iterations.
    assert [s.counts["generation_rounds"] for s in pooled[1:]] == [1] * 11
    assert max(s.counts["generation_rounds"] for s in missing) > 1
    assert [s.counts["trained_groups"] for s in pooled] == [G] * 12
    trained = [prompt for s in pooled for prompt in s.trained]
    assert len(trained) == len(set(trained))  # none twice, the oldest first as before
    assert all(now.trained == sorted(now.trained) for now in pooled)


def test_a_refill_policy_without_a_budget_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"partial_rollout_refill=pool needs rollout\.partial"):
        load_config("configs/tiny.yaml", ["rollout.partial_rollout_refill=pool"])


@pytest.mark.parametrize("budget", [1, 3, 5])
def test_every_iteration_trains_g_groups_whatever_the_budget(budget):
    runner = make_runner(longtail, f"rollout.partial_rollout_budget={budget}")
    steps = iterate(runner, 8)
    assert [s.counts["trained_groups"] for s in steps] == [G] * 8
    cap = -(-LENGTH // budget)
    assert max(s.counts["generation_rounds"] for s in steps) <= cap


def resumed(runner: ScriptedRounds) -> ScriptedRounds:
    """A fresh runner continuing ``runner`` from a checkpoint taken between iterations:
    the bookkeeping through the position's plain-data form, and the dock's samples (here
    the scripted engine's tokens and prompts) as actor rank 0 puts them back."""
    state = runner.in_flight_state()
    slots = sorted(runner.pool.flights)
    indexes = runner.indexes(slots)
    # The slices name every sample of every group in flight: each prompt, and each
    # response either paused (its prefix) or finished.
    prompts, paused, finished = state.slices
    assert prompts.indexes.tolist() == indexes.tolist()
    assert paused.indexes.tolist() == runner.pool.paused.tolist() and len(paused.indexes)
    assert sorted([*paused.indexes.tolist(), *finished.indexes.tolist()]) == indexes.tolist()
    bookkeeping = decode(json.loads(json.dumps(encode(state.bookkeeping, {}))), {})
    fresh = make_runner(longtail)
    fresh.run.dataset.drawn = runner.run.dataset.drawn  # the data position
    fresh.run.dock.put = set(indexes.tolist())
    fresh.tokens = {i: runner.tokens[i] for i in indexes.tolist()}
    fresh.prompt_of = {slot: runner.prompt_of[slot] for slot in slots}
    fresh.restore_in_flight(bookkeeping)
    return fresh


def test_a_resumed_runner_schedules_the_groups_in_flight_as_the_uninterrupted_one():
    whole = iterate(make_runner(longtail), 12)
    runner = make_runner(longtail)
    before = iterate(runner, 5)
    # At the checkpoint, groups with paused responses and finished groups held back wait.
    counts = before[-1].counts
    assert counts["paused_responses"] > 0 and counts["carried_finished_groups"] > 0
    after = iterate(resumed(runner), 7, first=5)
    assert before + after == whole


def test_nothing_in_flight_keeps_nothing():
    runner = make_runner(longtail, f"rollout.partial_rollout_budget={LENGTH}")
    iterate(runner, 2)
    assert runner.in_flight_state() is None  # the checkpoint is a synchronous run's
