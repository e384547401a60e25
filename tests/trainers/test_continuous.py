"""Continuous generation (``rollout.continuous``, trainers/driver/continuous.py) through
the whole pipeline on the shared Ray cluster: one rollout worker decoding continuously
beside one trainer rank on the long-tail task, every update trains a full batch within
the staleness bound, the hand-over overlaps, and a checkpoint (which interrupts the
worker) resumes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.foundation.plans import DISAGGREGATED
from tests.trainers.test_pipeline import NO_VLLM_REASON, records_of, resumed_records, trained_run
from trainers.driver.setup import PLACEMENT_FILE

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]

G = 16  # tiny's data.global_batch_size
#: Responses of 1 to 8 tokens (the untrained policy mostly runs to the cap), one update
#: of staleness allowed, a KL term (so the frozen reference scores finished groups while
#: the worker decodes), two reward workers (each group's reward and advantages computed
#: whole by one of them), checkpointed after iteration 1.
CONTINUOUS = (
    *DISAGGREGATED,
    "reward.workers=2",
    "rollout.continuous=true",
    "rollout.max_staleness=1",
    "data.source=synthetic:longtail",
    "rollout.max_response_length=8",
    "algorithm.kl_coef=0.001",
    "iterations=4",
    "checkpoint.every=2",
)


@pytest.fixture(scope="module")
def continuous_run(ray_cluster, tmp_path_factory) -> Path:
    return trained_run(tmp_path_factory, "grpo", *CONTINUOUS)


@pytest.fixture(scope="module")
def records(continuous_run) -> list[dict]:
    return records_of(continuous_run)


def test_every_update_trains_a_full_batch_within_the_staleness_bound(records):
    assert [r["trained_groups"] for r in records] == [G] * 4
    assert all(r["staleness_max"] <= 1 for r in records)
    assert records[0]["staleness_max"] == 0  # nothing was trained before it
    # Groups train in draw order, a due one waited for: none is refused for its length,
    # so every drawn group was trained or is still in the dock.
    assert all(r["dropped_stale_groups"] == 0 for r in records)
    drawn = sum(r["drawn_groups"] for r in records)
    assert drawn == 4 * G + records[-1]["carried_groups"]
    assert all(r["carried_groups"] <= G for r in records)  # a pool of 2 batches


def test_lagging_tokens_are_weighted_and_fresh_ones_are_not(records):
    first = records[0]
    assert first["is_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    assert first["rollout_logprob_diff"] < 1e-5  # the hand-over is exact
    lagged = [r for r in records if r["staleness_max"] == 1]
    assert lagged and all(abs(r["is_weight_mean"] - 1.0) > 1e-4 for r in lagged)


def test_the_worker_decodes_beside_training_and_takes_weights_between_steps(records):
    assert all(r["decode_steps"] > 0 and r["overlap"]["rollout"] > 0 for r in records)
    later = records[1:]
    assert all("weight_transfer" in r["time"] for r in later if r["iteration"] != 2)
    assert sum(r["weights_loaded_while_decoding"] for r in records) >= 2
    # Reward, the reference pass and GRPO's group advantages (in reward's calls) scored
    # finished groups while the worker decoded. An update whose whole batch was scored
    # before the previous record books none, so the run as a whole scored beside
    # decoding, and every streamed second counts as overlap: none is on the path to the
    # update, and no advantage stage runs between the last group and the update.
    streamed = ("reward", "ref_logp")
    assert all(sum(r["overlap"][s] for r in records) > 0 for s in streamed)
    assert all(r["busy"][s] == r["overlap"][s] for r in records for s in streamed)
    assert all(r["time"][s] == 0.0 for r in records for s in streamed)
    assert all("advantage" not in r["time"] for r in records)
    assert all(sum(r["scoring_chunks"][s] for r in records) > 0 for s in streamed)
    assert all(set(r["scoring_chunks"]) == set(streamed) for r in records)
    # Their dock time was spent in the scoring workers meanwhile: booked beside the
    # iteration, not as its overhead (which then holds the driver's and the training
    # stages' dock calls alone).
    assert sum(r["overhead"].get("dock_beside_s", 0.0) for r in records) > 0
    assert all(r["overhead"]["dock_s"] > 0 for r in records)


@pytest.mark.long  # a whole-run resume of this mode: pytest -m long (pyproject.toml)
def test_a_run_resumed_from_a_checkpoint_that_interrupted_the_worker_trains_on(
    continuous_run, records, tmp_path
):
    resumed = resumed_records(continuous_run, tmp_path, "grpo", *CONTINUOUS)
    assert [r["iteration"] for r in resumed] == [2, 3]
    assert [r["trained_groups"] for r in resumed] == [G, G]
    assert all(r["staleness_max"] <= 1 for r in resumed)


#: One device on each of the cluster's three nodes: the trainer on one, a rollout worker
#: on each of the others.
ON_THREE_NODES = (
    *CONTINUOUS,
    "resources.nodes=3",
    "resources.devices_per_node=1",
    "rollout.devices=2",
    "iterations=3",
    "checkpoint.every=0",
)


def test_rollout_workers_on_other_nodes_decode_for_the_trainer(tmp_path_factory):
    run_dir = trained_run(tmp_path_factory, "grpo", *ON_THREE_NODES)
    placement = json.loads((run_dir / "run" / PLACEMENT_FILE).read_text())
    rollout, actor = placement["ranks"]["rollout"], placement["ranks"]["actor"]
    assert len(set(rollout)) == 2 and not set(rollout) & set(actor)
    assert len(set(placement["warehouses"])) == 3  # one per node, rollout nodes' included
    records = records_of(run_dir)
    assert [r["trained_groups"] for r in records] == [G] * 3
    assert all(r["staleness_max"] <= 1 and r["dropped_stale_groups"] == 0 for r in records)
    # The weights crossed nodes exactly: iteration 0's samples are the trainer's policy.
    assert records[0]["rollout_logprob_diff"] < 1e-5
    assert sum(r["weights_loaded_while_decoding"] for r in records) >= 1


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason=NO_VLLM_REASON)
def test_vllm_decodes_continuously_through_its_request_queue(tmp_path_factory):
    """The same run with vLLM's engine: its requests join and leave the engine's queue,
    and new weights load between two of its steps."""
    records = records_of(trained_run(tmp_path_factory, "grpo", *CONTINUOUS, "rollout.engine=vllm"))

    assert [r["trained_groups"] for r in records] == [G] * 4
    assert all(r["staleness_max"] <= 1 and r["dropped_stale_groups"] == 0 for r in records)
    assert sum(r["weights_loaded_while_decoding"] for r in records) >= 2
    assert records[0]["rollout_logprob_diff"] < 1e-4  # vLLM holds exactly the trained weights


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason=NO_VLLM_REASON)
def test_a_vllm_rollout_worker_splits_its_model_over_the_two_devices_it_holds(
    tmp_path_factory,
):
    """``rollout.tp: 2`` disaggregated: one rollout worker holds a bundle of two devices
    and its vLLM engine runs a TP rank on each; the whole weights it receives are split
    by vLLM's own loaders."""
    two = ("resources.devices_per_node=3", "rollout.devices=2", "rollout.tp=2")
    run_dir = trained_run(
        tmp_path_factory, "grpo", *CONTINUOUS, *two, "rollout.engine=vllm", "iterations=3",
        "checkpoint.every=0",
    )  # fmt: skip
    placement = json.loads((run_dir / "run" / PLACEMENT_FILE).read_text())
    assert len(placement["ranks"]["rollout"]) == 1  # one worker for the two devices
    records = records_of(run_dir)
    assert [r["trained_groups"] for r in records] == [G] * 3
    assert records[0]["rollout_logprob_diff"] < 1e-4  # the split weights are the trained ones
    assert sum(r["weights_loaded_while_decoding"] for r in records) >= 1
