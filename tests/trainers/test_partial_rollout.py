"""Partial rollout (``rollout.partial_rollout_budget``) through the whole pipeline on the
shared Ray cluster: a budget no response reaches trains today's run, and a budget the
long-tail task's responses outgrow pauses them, keeps them in the dock and trains each
group once all its responses finished.
"""

from __future__ import annotations

import pytest

from tests.trainers.conftest import WITH_REFERENCE
from tests.trainers.test_pipeline import trained_records
from tests.trainers.test_streaming import outcomes

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]

G = 16  # tiny's data.global_batch_size
#: The long-tail task with responses of up to 8 tokens, 4 new ones per iteration: the
#: untrained policy rarely stops early, so its responses pause once and finish next time.
LONGTAIL = (
    "data.source=synthetic:longtail",
    "rollout.max_response_length=8",
    "rollout.partial_rollout_budget=4",
    "iterations=3",
)


@pytest.fixture(scope="module")
def unreached_records(ray_cluster, tmp_path_factory) -> list[dict]:
    budget = "rollout.partial_rollout_budget=4"  # tiny's max_response_length
    return trained_records(tmp_path_factory.mktemp("unreached"), "grpo", *WITH_REFERENCE, budget)


@pytest.fixture(scope="module")
def longtail_records(ray_cluster, tmp_path_factory) -> list[dict]:
    return trained_records(tmp_path_factory.mktemp("longtail"), "grpo", *LONGTAIL)


def test_a_budget_no_response_reaches_trains_todays_run(sync_records, unreached_records):
    assert len(unreached_records) == len(sync_records) == 2
    for today, partial in zip(sync_records, unreached_records, strict=True):
        assert (partial["trained_groups"], partial["paused_responses"]) == (G, 0)
        # The same prompts, responses and rewards, bit for bit ...
        for key in ("reward_mean", "response_length_mean", "prompt_length_mean"):
            assert partial[key] == today[key]
        # ... and the same step: the behaviour weights partial rollout adds are 1 up to the
        # engines' float32 disagreement (rollout_logprob_diff), as every token is on-policy.
        assert partial["is_weight_mean"] == pytest.approx(1.0, abs=1e-5)
        shared = {k: v for k, v in outcomes(partial).items() if k in today}
        assert shared == pytest.approx(outcomes(today), rel=1e-5, abs=1e-6)


def test_unfinished_responses_pause_and_their_groups_train_once_finished(longtail_records):
    first, second, third = longtail_records
    # Iteration 0: every group holds a response past 4 tokens, so nothing trains yet ...
    assert first["paused_responses"] > 0 and first["trained_groups"] < G
    assert "pg_loss" not in first or first["trained_groups"] > 0
    # ... iteration 1 continues them to their end (8 tokens at most) and trains them all:
    # the G groups in flight are the ones paused before, no fresh prompt was drawn.
    assert second["trained_groups"] == G - first["trained_groups"]
    assert second["paused_responses"] == 0
    assert 4 < second["response_length_mean"] <= 8
    assert "is_weight_mean" in second  # the loss weighed each token by its behaviour ratio
    # Iteration 2 fills the freed slots with fresh prompts, which pause again.
    assert third["paused_responses"] > 0
    assert all(r["iteration_time_s"] > 0 for r in longtail_records)
