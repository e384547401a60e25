"""Partial rollout (``rollout.partial_rollout_budget``) through the whole pipeline on the
shared Ray cluster: a budget no response reaches trains today's run, and a budget the
long-tail task's responses outgrow runs generation rounds until a full batch of groups
finished, trains G of them and carries the rest, paused or finished, over
(test_partial_rollout_schedule.py pins the order and the cap without Ray).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from mindrl.data import PromptDataset
from tests.trainers.conftest import WITH_REFERENCE
from tests.trainers.test_pipeline import ONE_DEVICE, resumed_records, trained_records
from tests.trainers.test_streaming import outcomes
from trainers.driver.partial_rollout import PartialRolloutSource

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]

G = 16  # tiny's data.global_batch_size
#: The long-tail task with responses of up to 8 tokens, 4 new ones per round: the
#: untrained policy rarely stops early, so most responses pause once; at most 2 rounds.
LONGTAIL = (
    "data.source=synthetic:longtail",
    "rollout.max_response_length=8",
    "rollout.partial_rollout_budget=4",
    "iterations=5",
)

#: Room for 4 rounds of 4 tokens, checkpointed after iteration 1: the checkpoint is taken
#: with paused responses and finished groups waiting in the dock. On one device: what the
#: checkpoint keeps does not depend on the layout.
LONGTAIL_RESUMED = (
    "data.source=synthetic:longtail",
    "rollout.max_response_length=16",
    "rollout.partial_rollout_budget=4",
    "iterations=4",
    "checkpoint.every=2",
    *ONE_DEVICE,
)


@dataclass
class Iteration:
    """What one iteration's update took and left, by the draw number of each group."""

    trained: list[int]
    in_dock: list[int]  # every group left in the dock after the update
    drawn: int  # prompts the dataset handed out so far


@dataclass
class LongtailRun:
    records: list[dict]
    iterations: list[Iteration]


@pytest.fixture(scope="module")
def unreached_records(ray_cluster, tmp_path_factory) -> list[dict]:
    budget = "rollout.partial_rollout_budget=4"  # tiny's max_response_length
    return trained_records(tmp_path_factory.mktemp("unreached"), "grpo", *WITH_REFERENCE, budget)


@pytest.fixture(scope="module")
def longtail(ray_cluster, tmp_path_factory) -> LongtailRun:
    """The long-tail run, watching which groups each update trained (the driver runs in
    this process) and how many prompts the dataset handed out."""
    iterations: list[Iteration] = []
    drawn = [0]
    count_groups, next_batch = PartialRolloutSource.counts, PromptDataset.next_batch

    def counting_draws(self, count=None):
        batch = next_batch(self, count)
        drawn[0] += len(batch.uids)
        return batch

    def watching(self, sampled):
        trained = [flight.order for flight in self.pool.trained]
        in_dock = [flight.order for flight in self.pool.flights.values()]
        iterations.append(Iteration(trained, in_dock, drawn[0]))
        return count_groups(self, sampled)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(PartialRolloutSource, "counts", watching)
        patch.setattr(PromptDataset, "next_batch", counting_draws)
        records = trained_records(tmp_path_factory.mktemp("longtail"), "grpo", *LONGTAIL)
    return LongtailRun(records, iterations)


def test_a_budget_no_response_reaches_trains_todays_run(sync_records, unreached_records):
    assert len(unreached_records) == len(sync_records) == 2
    for today, partial in zip(sync_records, unreached_records, strict=True):
        assert (partial["trained_groups"], partial["paused_responses"]) == (G, 0)
        # One round of G fresh prompts, nothing left in the dock.
        assert (partial["generation_rounds"], partial["drawn_groups"]) == (1, G)
        assert partial["carried_groups"] == partial["carried_finished_groups"] == 0
        assert partial["staleness_max"] == 0
        # The same prompts, responses and rewards, bit for bit ...
        for key in ("reward_mean", "response_length_mean", "prompt_length_mean"):
            assert partial[key] == today[key]
        # ... and the same step: the behaviour weights partial rollout adds are 1 up to the
        # engines' float32 disagreement (rollout_logprob_diff), as every token is on-policy.
        assert partial["is_weight_mean"] == pytest.approx(1.0, abs=1e-5)
        shared = {k: v for k, v in outcomes(partial).items() if k in today}
        assert shared == pytest.approx(outcomes(today), rel=1e-5, abs=1e-6)


def test_every_iteration_trains_exactly_a_full_batch_within_the_round_cap(longtail):
    records = longtail.records
    assert [r["trained_groups"] for r in records] == [G] * len(records)
    # ceil(8 / 4) = 2 rounds finish every response in the dock after the first refill.
    assert all(1 <= r["generation_rounds"] <= 2 for r in records)
    # Iteration 0: the first G responses mostly paused, so a second round drew more
    # prompts and continued them to their end (8 tokens at most).
    first = records[0]
    assert first["generation_rounds"] == 2 and first["drawn_groups"] > G
    assert 4 < first["response_length_mean"] <= 8
    # What was not trained stays in flight: paused responses and finished groups.
    assert any(r["paused_responses"] > 0 for r in records)
    assert all(r["carried_groups"] >= r["carried_finished_groups"] for r in records)
    assert all("pg_loss" in r and r["iteration_time_s"] > 0 for r in records)


def test_no_group_trains_twice_and_every_prompt_drawn_is_trained_or_still_in_the_dock(
    longtail,
):
    iterations = longtail.iterations
    trained = [order for it in iterations for order in it.trained]
    assert len(trained) == len(set(trained)) == G * len(iterations)
    last = iterations[-1]
    assert not set(trained) & set(last.in_dock)
    assert sorted(trained + last.in_dock) == list(range(last.drawn))
    # The records' counts say the same: drawn = trained + left in the dock.
    records = longtail.records
    drawn = sum(r["drawn_groups"] for r in records)
    assert drawn == last.drawn == sum(r["trained_groups"] for r in records) + len(last.in_dock)
    assert records[-1]["carried_groups"] == len(last.in_dock)


def test_tokens_sampled_before_an_update_are_weighted_by_their_behaviour_ratio(longtail):
    records = longtail.records
    lagging = [r for r in records if r["staleness_max"] >= 1]
    assert lagging and records[0]["staleness_max"] == 0
    # Tokens from older weights: the truncated IS weight min(pi_old / mu, C) moves off 1
    # (on-policy it is 1 within 1e-5, the first test).
    assert all(abs(r["is_weight_mean"] - 1.0) > 1e-4 for r in lagging)


@pytest.mark.long  # a whole-run resume of this mode: pytest -m long (pyproject.toml)
def test_a_resumed_run_continues_the_groups_in_flight_as_the_uninterrupted_run(tmp_path):
    whole = trained_records(tmp_path / "whole", "grpo", *LONGTAIL_RESUMED)
    # The checkpoint after iteration 1 holds paused responses and (with them) groups
    # not trained yet; resumed without them, iteration 2 would draw fresh prompts.
    assert whole[1]["paused_responses"] > 0 and whole[1]["carried_groups"] > 0
    resumed = resumed_records(tmp_path / "whole", tmp_path / "resumed", "grpo", *LONGTAIL_RESUMED)
    assert [r["iteration"] for r in resumed] == [2, 3]
    # Every number but timings, exactly: the same prompts, prefixes, tokens and updates.
    assert [outcomes(r) for r in resumed] == [outcomes(r) for r in whole[2:]]


def test_the_update_computes_no_padding_beyond_the_sequence_parallel_tail(longtail):
    """synthetic:longtail's prompts are 1-2 digits or, one in eight, 12: right-padded rows
    computed 1.17-1.19 positions per real token on it; packed rows pad only each
    micro-batch's tail to a multiple of TP (2)."""
    for record in longtail.records:
        assert 1.0 <= record["train_tokens_per_real_token"] <= 1.10
