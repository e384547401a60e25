"""A rollout worker's decode loop (mindrl/workers/continuous.py) over a real dock (the
shared Ray cluster) and the real hf engine: groups go to the dock whole as they finish,
every token records the weights version that sampled it, and a stopped loop leaves its
live sequences paused in the dock, continued from exactly their prefix when fed again."""

from __future__ import annotations

import time

import numpy as np
import pytest

from backends.generation import SamplingParams
from mindrl.dock import DockClient
from mindrl.workers.continuous import ContinuousGenerator, Feed
from mindrl.workers.generation import paused_prefixes
from tests.generation.conftest import (
    INDEXES,
    MAX_MODEL_LEN,
    NOTHING,
    PROMPTS,
    N,
    dock_with_prompts,
    reference_model,
)
from tests.generation.test_engines import argmax_decode

pytestmark = pytest.mark.ray

LENGTH = 40  # no stop token: every response runs to this length
GREEDY = SamplingParams(temperature=0, max_tokens=LENGTH)


@pytest.fixture
def dock(ray_cluster):
    yield from dock_with_prompts(["response_ids"])


class StopAfterSteps:
    """The real engine, whose continuous batch asks the loop to stop after ``steps``
    decode steps (a test hook: the loop then interrupts between two steps, at a known
    point, whatever the machine's speed)."""

    def __init__(self, engine, steps: int) -> None:
        self.engine, self.steps, self.loop = engine, steps, None

    def continuous(self, params):
        batch, hook = self.engine.continuous(params), self

        class Counted(type(batch)):
            def step(self):
                ended = super().step()
                hook.steps -= 1
                if hook.steps == 0:
                    hook.loop.request_stop()
                return ended

        batch.__class__ = Counted
        return batch

    def load_weights(self, named) -> None:
        self.engine.load_weights(named)


def wait_for(dock: DockClient, count: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while dock.ready_count("reward", ["response_ids"]) < count:
        assert time.monotonic() < deadline, "the loop never put the responses"
        time.sleep(0.02)


def fetched(dock: DockClient, indexes: np.ndarray) -> list[tuple[list[int], list[int]]]:
    data = dock.fetch(indexes, ["response_ids", "rollout_version"])
    lengths = data["response_ids_lengths"].tolist()
    return [
        (data["response_ids"][k, :n].tolist(), data["rollout_version"][k, :n].tolist())
        for k, n in enumerate(lengths)
    ]


def test_groups_reach_the_dock_whole_with_the_version_of_every_token(
    dock, engine, weights_a, weights_b
):
    loop = ContinuousGenerator(dock, engine, GREEDY, N, 2, MAX_MODEL_LEN, version=0)
    try:
        loop.feed(Feed(INDEXES[:2], NOTHING))
        wait_for(dock, 2)
        # New weights, then the second group: loaded before it starts.
        loop.offer_weights(1, list(weights_b.items()))
        loop.feed(Feed(INDEXES[2:], NOTHING))
        wait_for(dock, 4)
        assert loop.status()["weight_loads"] == 1
        left = loop.stop()
        assert len(left["paused"]) == len(left["unstarted"]) == 0  # nothing was live
    finally:
        engine.load_weights(weights_a.items())
    first, second = fetched(dock, INDEXES[:2]), fetched(dock, INDEXES[2:])
    assert all(v == [0] * LENGTH for _, v in first)
    assert all(v == [1] * LENGTH for _, v in second)
    assert all(t == argmax_decode(reference_model(weights_a), PROMPTS[0], LENGTH) for t, _ in first)
    assert all(
        t == argmax_decode(reference_model(weights_b), PROMPTS[2], LENGTH) for t, _ in second
    )
    # Each put told the controllers its tokens' oldest version (the staleness bound's).
    assert dock.versions("reward", INDEXES).tolist() == [0, 0, 1, 1]


def test_a_stopped_loop_pauses_its_live_sequences_and_a_fed_one_continues_them(
    dock, engine, reference_a
):
    stopping = StopAfterSteps(engine, steps=5)
    loop = ContinuousGenerator(dock, stopping, GREEDY, N, 4, MAX_MODEL_LEN, version=0)
    stopping.loop = loop
    loop.feed(Feed(INDEXES, NOTHING))
    deadline = time.monotonic() + 60
    while stopping.steps > 0:  # the hook asks the loop to stop after its 5th step
        assert time.monotonic() < deadline, "the loop never took 5 steps"
        time.sleep(0.01)
    left = loop.stop()
    assert left["paused"].tolist() == INDEXES.tolist() and len(left["unstarted"]) == 0
    assert dock.ready_count("reward", ["response_ids"]) == 0  # paused: no stage sees them
    prefixes = paused_prefixes(dock, INDEXES, INDEXES, versions=True)
    assert [(len(p.token_ids), p.versions) for p in prefixes] == [(5, [0] * 5)] * 4
    # Fed again to a loop holding version 1 (the same weights here): continued from the
    # prefix, each token keeping the version that sampled it.
    again = ContinuousGenerator(dock, engine, GREEDY, N, 4, MAX_MODEL_LEN, version=1)
    again.feed(Feed(INDEXES, left["paused"]))
    wait_for(dock, 4)
    again.stop()
    for k, (tokens, versions) in enumerate(fetched(dock, INDEXES)):
        assert tokens[:5] == prefixes[k].token_ids
        assert tokens == argmax_decode(reference_a, PROMPTS[k], LENGTH)
        assert versions == [0] * 5 + [1] * (LENGTH - 5)
    assert dock.versions("reward", INDEXES).tolist() == [0] * 4


class OfferAfterSteps(StopAfterSteps):
    """The real engine, whose continuous batch offers the loop new weights after
    ``steps`` decode steps (a test hook, as :class:`StopAfterSteps`)."""

    def __init__(self, engine, steps: int, weights) -> None:
        super().__init__(engine, steps)
        self.weights = weights

    def continuous(self, params):
        batch, hook = self.engine.continuous(params), self

        class Offering(type(batch)):
            def step(self):
                ended = super().step()
                hook.steps -= 1
                if hook.steps == 0:
                    hook.loop.offer_weights(1, list(hook.weights.items()))
                return ended

        batch.__class__ = Offering
        return batch


def test_weights_offered_mid_decode_version_the_later_tokens_only(
    dock, engine, weights_a, weights_b
):
    offering = OfferAfterSteps(engine, steps=5, weights=weights_b)
    loop = ContinuousGenerator(dock, offering, GREEDY, N, 2, MAX_MODEL_LEN, version=0)
    offering.loop = loop
    try:
        loop.feed(Feed(INDEXES[:2], NOTHING))
        wait_for(dock, 2)
        assert loop.status()["weight_loads"] == 1
        loop.stop()
    finally:
        engine.load_weights(weights_a.items())
    greedy_a = argmax_decode(reference_model(weights_a), PROMPTS[0], LENGTH)
    for tokens, versions in fetched(dock, INDEXES[:2]):
        # Five tokens sampled before the load keep version 0, every later one is 1's.
        assert versions == [0] * 5 + [1] * (LENGTH - 5)
        assert tokens[:5] == greedy_a[:5] and tokens != greedy_a
    # The put names the oldest version among the group's tokens.
    assert dock.versions("reward", INDEXES[:2]).tolist() == [0, 0]
