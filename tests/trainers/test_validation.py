"""Validation (``data.val_every``) on the shared Ray cluster: held-out prompts through the
rollout engine and the reward workers, logged as ``val/...``, without moving training.

One run without and one with validation (module fixtures, one per test so each test
holds a single run's start-up within the suite's per-test timeout). Validation samples
at temperature 1 here, the stricter case: its sampling must not touch training's. The
validated run also reads the built-in tokenizer from a folder (same ids, so the same
training), which its end-of-run export must write into RUN_DIR/hf.
"""

from __future__ import annotations

import pytest

from mindrl.data import build_tiny_tokenizer
from tests.trainers.test_pipeline import ONE_DEVICE, trained_records

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]

ITERATIONS = ("iterations=3",)
VALIDATION = (
    "data.val_every=2",
    "data.val_source=synthetic:tiny",
    "data.val_num_prompts=8",
    "data.val_n=4",
    "data.val_temperature=1.0",
)
#: What training decides, iteration by iteration (timings and memory may differ).
TRAINING_KEYS = ("reward_mean", "response_length_mean", "pg_loss", "grad_norm", "entropy")


def run_records(run_dir, *overrides: str) -> list[dict]:
    return trained_records(run_dir, "grpo", *ITERATIONS, *ONE_DEVICE, *overrides)


@pytest.fixture(scope="module")
def plain_records(ray_cluster, tmp_path_factory) -> list[dict]:
    return run_records(tmp_path_factory.mktemp("plain"))


@pytest.fixture(scope="module")
def validated(ray_cluster, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("validated")
    build_tiny_tokenizer().save_pretrained(run_dir / "tokenizer")
    tokenizer = f"model.tokenizer={run_dir / 'tokenizer'}"
    return run_dir, run_records(run_dir, *VALIDATION, "logging.backends=[tensorboard]", tokenizer)


def test_a_run_without_validation_logs_no_val_metrics(plain_records):
    assert len(plain_records) == 3
    assert not [key for record in plain_records for key in record if key.startswith("val/")]


def test_validation_runs_every_val_every_iterations_and_after_the_last(validated):
    _, records = validated
    assert [("val/reward_mean" in r) for r in records] == [False, True, True]
    for record in records[1:]:
        assert 0.0 <= record["val/reward_mean"] <= 1.0
        assert 0.0 <= record["val/pass@4"] <= 1.0
        assert 1.0 <= record["val/response_length_mean"] <= 4.0  # max_response_length 4


def test_validation_reaches_tensorboard(validated):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, records = validated
    events = EventAccumulator(str(run_dir / "run" / "tensorboard"))
    events.Reload()
    logged = [(e.step, e.value) for e in events.Scalars("val/reward_mean")]
    assert logged == [(i, pytest.approx(records[i]["val/reward_mean"])) for i in (1, 2)]


def test_a_run_with_validation_trains_exactly_like_one_without(plain_records, validated):
    _, records = validated
    for key in TRAINING_KEYS:
        assert [r[key] for r in records] == [r[key] for r in plain_records], key


def test_the_trained_model_folder_carries_a_tokenizer_that_came_from_a_folder(validated):
    from transformers import AutoTokenizer

    run_dir, _ = validated
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "run" / "hf")  # a llama config
    text = "next 3 1 4 ="
    assert (
        tokenizer(text).input_ids == build_tiny_tokenizer()(text).input_ids == [1, 16, 7, 5, 8, 19]
    )
