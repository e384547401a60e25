"""Rewards in a whole run on the shared Ray cluster: rows of two domains mixed by ratio,
each routed to its own reward (a builtin, a user's function from PYTHONPATH), a failing
reward whose groups are dropped, and the record's per-domain and per-function figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.trainers.test_pipeline import ONE_DEVICE, trained_records

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]

ITERATIONS = 3


def mixed_rows(path: Path) -> Path:
    """Tiny-task prompts of domains ``a`` and ``b``; one ``b`` row breaks its reward."""
    rows = [
        {"prompt": f"next : {d} =", "answer": str((d + 1) % 10), "domain": domain}
        | ({"breaks": True} if domain == "b" and d == 4 else {})
        for domain in ("a", "b")
        for d in range(10)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> list[dict]:
    root = tmp_path_factory.mktemp("mixed")
    return trained_records(
        root,
        "grpo",
        f"data.source={mixed_rows(root / 'rows.jsonl')}",
        "data.mixture={a: 0.5, b: 0.5}",
        "reward.functions={says: {fn: 'tests.rewards.user_rewards:says_the_answer', "
        "kwargs: {bonus: 0.5}}}",
        "reward.routes={a: [synthetic], b: [{fn: says, weight: 2.0}]}",
        "reward.max_failure_fraction=0.5",
        f"iterations={ITERATIONS}",
        *ONE_DEVICE,
    )


def test_each_domain_gets_its_own_reward_and_both_are_in_every_record(records):
    assert len(records) == ITERATIONS
    for record in records:
        assert 0.0 <= record["reward/a"] <= 1.0
        assert record["reward/b"] in {0.0, 3.0} or 0.0 < record["reward/b"] < 3.0
        assert record["reward_fn/synthetic/error_rate"] == 0.0


def test_a_reward_that_raises_is_an_error_and_its_group_trains_nowhere(records):
    broke = [r for r in records if r["reward_fn/says/error_rate"] > 0]
    assert broke, "the breaking row was never drawn"
    for record in broke:  # every response to the breaking row failed: its group is dropped
        assert record["reward/dropped_groups"] >= 1
        assert record["reward/failed_share"] > 0
    clean = [r for r in records if r["reward_fn/says/error_rate"] == 0]
    assert all(r["reward/dropped_groups"] == 0 == r["reward/failed_share"] for r in clean)


def test_each_functions_latency_is_recorded(records):
    for record in records:
        p50, p99 = record["reward_fn/says/latency_p50_s"], record["reward_fn/says/latency_p99_s"]
        assert 0 < p50 <= p99 < 30
