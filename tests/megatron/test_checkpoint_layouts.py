"""Checkpoints hold full tensors and plain data: a run saved at one layout resumes at
another, loading runs no code, and a corrupt checkpoint is named with the step before it."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch

from backends.megatron import checkpoint
from tests.megatron import cases, checkpoint_cases
from tests.support.spawn import run_ranks


@pytest.fixture(scope="module")
def tp2_to_dp2(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt") / "actor"
    return root, run_ranks(checkpoint_cases.tp2_then_dp2, 2, str(root))


def test_a_run_saved_at_tp2_resumes_at_tp1_dp2_with_its_weights_and_adam_state(tp2_to_dp2):
    _, ranks = tp2_to_dp2
    for result in ranks:
        assert result["same_weights"] and result["same_moments"]
        assert result["moment_keys"] == ["exp_avg", "exp_avg_sq", "step"]
        assert result["position"] == {"next_step": 2}
        step, lr = result["step_and_lr"]
        # the LR schedule goes on at step 2: cosine after 1 warm-up step, 1/3 of the way
        assert step == 2 and lr == pytest.approx(0.01 * 0.75)
        # Same weights, moments, step and LR: the next two steps are the uninterrupted
        # run's, up to the summation order of another layout.
        torch.testing.assert_close(
            torch.tensor(result["resumed"]),
            torch.tensor(result["uninterrupted"]),
            **cases.SAME_DEVICE_TOL,
        )


def test_a_checkpoint_is_safetensors_and_json_with_no_pickle(tp2_to_dp2):
    root, ranks = tp2_to_dp2
    step_dir = Path(ranks[0]["saved_dir"])
    assert (root / "latest").read_text().strip() == step_dir.name == "step_00000002"
    files = sorted(str(p.relative_to(step_dir)) for p in step_dir.rglob("*") if p.is_file())
    assert all(f.endswith((".safetensors", ".json")) for f in files), files
    assert "rng/rank_00001.safetensors" in files and "model.safetensors" in files
    meta = json.loads((step_dir / "meta.json").read_text())
    assert meta["layout"]["tp"] == 2 and meta["optimizer"] == "adamw" and meta["step"] == 2
    for file in step_dir.rglob("*"):
        assert b"\x80\x04\x95" not in file.read_bytes() if file.is_file() else True  # pickle


def _fake_step(root: Path, step: int) -> Path:
    """A minimal complete step folder written by the real writer's pieces."""
    step_dir = root / f"step_{step:08d}"
    checkpoint.save_tree(step_dir / "model", {"w": torch.arange(4.0)})
    files = {
        str(p.relative_to(step_dir)): p.stat().st_size for p in step_dir.rglob("*") if p.is_file()
    }
    (step_dir / "meta.json").write_text(json.dumps({"format": checkpoint.FORMAT, "files": files}))
    (root / "latest").write_text(step_dir.name + "\n")
    return step_dir


def test_a_corrupt_latest_checkpoint_names_the_file_and_the_previous_complete_step(tmp_path):
    older = _fake_step(tmp_path, 4)
    latest = _fake_step(tmp_path, 8)
    assert checkpoint.resolve(tmp_path) == latest
    weights = latest / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:20])  # truncated by a full disk
    with pytest.raises(checkpoint.CheckpointError) as err:
        checkpoint.resolve(tmp_path)
    message = str(err.value)
    assert message.startswith(f"checkpoint {latest} is corrupt: {weights} has 20 bytes")
    assert message.endswith(
        f"the previous complete step is {older}: resume from it with --resume-from {older}"
    )
    assert "\n" not in message
    assert checkpoint.resolve(older) == older  # --resume-from a step folder


def test_loading_never_unpickles_so_a_tampered_file_cannot_run_code(tmp_path):
    step_dir = _fake_step(tmp_path, 1)

    class Payload:
        def __reduce__(self):
            return (Path.touch, (tmp_path / "pwned",))

    (step_dir / "model.json").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(checkpoint.CheckpointError, match=r"model\.json"):
        checkpoint.resolve(tmp_path)
    with pytest.raises(ValueError):
        checkpoint.load_tree(step_dir / "model")
    assert not (tmp_path / "pwned").exists()


def test_plain_data_round_trips_through_json_and_safetensors(tmp_path):
    import numpy as np

    tree = {
        "rng": (3, (1, 2, 3), None),
        "numpy": ("MT19937", np.arange(5, dtype=np.uint32), 2),
        "groups": [{"betas": (0.9, 0.999), "lr": 1e-3}],
        (torch.float32, torch.float32): {"exp_avg": torch.ones(2, 3)},
    }
    checkpoint.save_tree(tmp_path / "tree", tree)
    back = checkpoint.load_tree(tmp_path / "tree")
    assert back["rng"] == (3, (1, 2, 3), None)
    assert back["numpy"][1].dtype == np.uint32 and back["numpy"][1].tolist() == [0, 1, 2, 3, 4]
    assert back["groups"] == [{"betas": (0.9, 0.999), "lr": 1e-3}]
    assert torch.equal(back[(torch.float32, torch.float32)]["exp_avg"], torch.ones(2, 3))
