"""The benchmarks' supervised warm start (benchmarks/harness/warm_start.py): it learns the
task's answers and saves a folder a run starts from (``model.hf_path``)."""

from __future__ import annotations

from pathlib import Path

import torch

from benchmarks.harness.warm_start import _teacher_forced, warm_start
from mindrl.config import load_config
from mindrl.config.specs import with_checkpoint_architecture
from mindrl.workers.model_setup import initial_model
from trainers.registry import get_algorithm

TINY = Path(__file__).parents[2] / "configs" / "tiny.yaml"


def test_teacher_forcing_scores_the_answer_tokens_only():
    ids, labels = _teacher_forced([[7, 8, 9], [4]], [[1, 2], [3, 5, 6]], pad=0)
    assert ids.tolist() == [[7, 8, 9, 1, 2], [4, 3, 5, 6, 0]]
    assert labels.tolist() == [[-100, -100, -100, 1, 2], [-100, 3, 5, 6, -100]]


def test_the_warm_start_learns_the_answers_and_a_run_starts_from_its_folder(tmp_path):
    overrides = ["data.source=synthetic:longtail", "rollout.max_response_length=16"]
    config = load_config(TINY, overrides, algorithm=get_algorithm("grpo"))
    report = warm_start(config, tmp_path / "warm", steps=40)
    # Untrained, the answer costs ~ln(vocab) nats a token; 40 steps cut it well below.
    assert report["loss_first"] > 2.5 and report["loss_last"] < 0.5 * report["loss_first"]
    run = load_config(TINY, [*overrides, f"model.hf_path={report['hf_path']}"])
    model = with_checkpoint_architecture(run.model)
    loaded = initial_model(model)
    assert loaded.spec.num_layers == config.model.num_layers
    assert loaded.spec.hidden_size == config.model.hidden_size
    assert all(torch.isfinite(t).all() for t in loaded.hf_state.values())
