"""DPO end to end: stored pairs through the dock, the reference's log-probs, the actor's
preference loss; no generation stage (trainers/driver/offline.py)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from mindrl.config import load_config
from mindrl.data.pairs import PAIR_FIELDS, make_digit_pairs
from mindrl.metrics import read_metrics
from tests.trainers.test_pipeline import ONE_DEVICE
from trainers.driver.cli import CONFIG_DIR, main
from trainers.driver.iteration import split_whole_pairs
from trainers.driver.train import train
from trainers.registry import get_algorithm

TINY_DPO = CONFIG_DIR / "tiny_dpo.yaml"


def tiny_dpo(run_dir: Path, *overrides: str):
    quiet = ["logging.progress_bar=false", "logging.backends=[]", "checkpoint.every=0"]
    return load_config(
        TINY_DPO, [f"logging.dir={run_dir}", *quiet, *overrides], algorithm=get_algorithm("dpo")
    )


def test_whole_pairs_go_to_each_data_parallel_rank_in_order():
    parts = split_whole_pairs(np.array([4, 5, 0, 1, 6, 7, 2, 3]), parts=2)
    assert [p.tolist() for p in parts] == [[4, 5, 0, 1], [6, 7, 2, 3]]
    with pytest.raises(ValueError, match="not 2 equal runs of whole pairs"):
        split_whole_pairs(np.arange(6), parts=2)


def write_pairs_file(path: Path, num_pairs: int, seed: int) -> Path:
    """The tiny task's pairs (``synthetic:tiny``'s generator) as a JSONL file, one
    ``{"prompt", "chosen", "rejected"}`` record a line, as a user's data would come."""
    rows = [asdict(pair) for pair in make_digit_pairs("tiny", num_pairs, seed)]
    path.write_text("".join(json.dumps({k: row[k] for k in PAIR_FIELDS}) + "\n" for row in rows))
    return path


@pytest.mark.ray
@pytest.mark.usefixtures("ray_cluster")
def test_tiny_dpo_learns_the_preference_from_a_jsonl_file_end_to_end(tmp_path, capsys):
    # synthetic:tiny's own pairs (data.num_prompts of them, the run's seed), so the file
    # run trains exactly as the synthetic one was measured; only the source differs.
    pairs = write_pairs_file(tmp_path / "pairs.jsonl", num_pairs=4096, seed=1234)
    # One device (policy and reference one process each): what is learned does not
    # depend on the layout.
    config = tiny_dpo(tmp_path / "run", "iterations=12", f"data.source={pairs}", *ONE_DEVICE)
    # 12 iterations of 32 pairs: ~0.3 s each after start-up on the 2-core box.
    assert train(config, "dpo", device="cpu") == 0
    out = capsys.readouterr()
    assert f"no generation (4096 stored pairs from {pairs})" in out.err
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["pairs"] for r in records] == [32] * 12
    accuracy = [r["preference_accuracy"] for r in records]
    # Iteration 0 scores the policy before its first step: it is the reference, so every
    # implicit reward is 0, no pair is ranked right and the loss is log 2.
    assert accuracy[0] == 0.0 and records[0]["reward_margin"] == 0.0
    assert records[0]["loss"] == pytest.approx(np.log(2), abs=1e-5)
    # Measured on this box, one device: 0.91 over iterations 8-11 (0.97 and up from ~30 on).
    assert np.mean(accuracy[-4:]) >= 0.8, accuracy
    last = records[-1]
    assert last["chosen_reward"] > 0 > last["rejected_reward"] and last["loss"] < 0.6
    assert set(last["time"]) == {"ref_logp", "update"}  # no rollout, reward or advantage
    assert "| pref_acc " in out.out
    assert (tmp_path / "run" / "hf" / "config.json").exists()


def test_a_pairs_file_missing_a_field_stops_dpo_in_one_line_before_any_worker(tmp_path, capsys):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"prompt": "next 1 =", "chosen": "2"}\n')
    code = main(
        ["--trainer", "dpo", "--config", str(TINY_DPO), f"data.source={pairs}",
         f"logging.dir={tmp_path / 'run'}"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert f"mindrl-train: error: {pairs}:1: no field 'rejected'" in err
    assert "starting worker processes" not in err
