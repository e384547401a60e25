"""Checkpoints are sharded and layout-free: each rank writes its part of the canonical
full tensors once over replicas (CP ranks are replicas too), and a run saved at one TP /
PP / EP / DP / CP layout, with either optimizer, resumes at another holding exactly the
same tensors and training on as the uninterrupted run; format-2 checkpoints still resume;
loading runs no code, and a corrupt checkpoint is named with the step before it."""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path

import pytest
import torch

from backends.megatron import checkpoint
from backends.megatron.sharded_store import FullTensors, read_index
from tests.megatron import cases, checkpoint_cases
from tests.megatron.checkpoint_cases import BACK_ON_TWO_RANKS, ON_TWO_RANKS
from tests.support.spawn import run_ranks

MOVES = sorted([*ON_TWO_RANKS, *BACK_ON_TWO_RANKS, "dp2_to_dp1"])
SAME_LAYOUT = ("same_dp2", "same_tp2")


@pytest.fixture(scope="module")
def moves(tmp_path_factory):
    """Every move's results (rank 0's: the losses are global) and the checkpoints' root."""
    root = tmp_path_factory.mktemp("moves")
    two = run_ranks(checkpoint_cases.moves_on_two_ranks, 2, str(root))[0]
    one = run_ranks(checkpoint_cases.one_rank, 1, str(root))[0]
    back = run_ranks(checkpoint_cases.back_on_two_ranks, 2, str(root))
    results = {**two, "dp2_to_dp1": {**one["dp2_to_dp1"], **_after(two["same_dp2"])}}
    for name, move in BACK_ON_TWO_RANKS.items():
        results[name] = {**back[0][name], "uninterrupted": one[f"one_{move.spec}"]}
    return root, results, [rank["format2"] for rank in back]


def _after(written: dict) -> dict:
    return {"uninterrupted": written["uninterrupted"]}


def _saved_dir(root: Path, move: str) -> Path:
    written = move if move in ON_TWO_RANKS else "same_dp2" if move == "dp2_to_dp1" else None
    if written is None:
        written = f"one_{BACK_ON_TWO_RANKS[move].spec}"
    return checkpoint.latest_dir(root / written / "saved")


@pytest.mark.parametrize("move", MOVES)
def test_a_checkpoint_resumed_at_another_layout_holds_exactly_the_saved_tensors(moves, move):
    root, _, _ = moves
    saved = FullTensors(_saved_dir(root, move) / checkpoint.SHARDS, "")
    resaved = FullTensors(checkpoint.latest_dir(root / move / "resaved") / checkpoint.SHARDS, "")
    assert sorted(resaved) == sorted(saved)
    assert any(name.startswith("optim/exp_avg_sq/") for name in saved)
    for name in saved:
        assert torch.equal(resaved[name], saved[name]), name


def test_the_rows_that_only_pad_the_vocabulary_are_handed_out_as_views_of_the_weights():
    # Loading zeroes them through these views: a copy would leave a fresh init's values.
    no_padding, padded = run_ranks(checkpoint_cases.padding_rows_written_through, 2)
    assert no_padding == {"pieces": 0, "last_rows_are_7": [False]}  # tied: one vocab weight
    assert padded == {"pieces": 1, "last_rows_are_7": [True]}


@pytest.mark.parametrize("move", MOVES)
def test_a_resumed_run_trains_on_as_the_uninterrupted_run(moves, move):
    _, results, _ = moves
    result = results[move]
    assert result["position"] == {"next_step": 2} and result["step"] == 2
    # the LR schedule goes on at step 2: cosine after 1 warm-up step, 1/3 of the way
    assert result["lr"] == pytest.approx(0.01 * 0.75)
    if move in SAME_LAYOUT:
        assert result["resumed"] == result["uninterrupted"]  # bit-exact on CPU
        return
    tolerance = {"rtol": 1e-2, "atol": 1e-2} if move.startswith("bf16") else cases.SAME_DEVICE_TOL
    torch.testing.assert_close(
        torch.tensor(result["resumed"]), torch.tensor(result["uninterrupted"]), **tolerance
    )


@pytest.mark.parametrize("move", ["same_dp2", "tp2_to_tp1", "ep2_to_ep1", "cp2_to_cp1"])
def test_every_rank_writes_its_part_once_and_no_replica_writes_it_again(moves, move):
    root, _, _ = moves
    shards = _saved_dir(root, move) / checkpoint.SHARDS
    index = read_index(shards)
    stored = {}
    for name, entry in index.items():
        volume = sum(math.prod(box["sizes"]) for box in entry["boxes"])
        assert volume == math.prod(entry["shape"]), name  # the boxes tile it exactly once
        for box in entry["boxes"]:
            size = math.prod(box["sizes"]) * (2 if entry["dtype"] == "BF16" else 4)
            stored[box["file"]] = stored.get(box["file"], 0) + size
    assert sorted(stored) == ["rank_00000.safetensors", "rank_00001.safetensors"]
    total = sum(stored.values())
    assert all(0.3 * total < part < 0.7 * total for part in stored.values()), stored


def test_a_bf16_model_keeps_its_fp32_main_weights(moves):
    root, _, _ = moves
    saved = FullTensors(_saved_dir(root, "bf16_dp2_to_tp2") / checkpoint.SHARDS, "")
    main = saved["optim/main/decoder.layers.0.mlp.linear_fc1.weight"]
    weight = saved["model/decoder.layers.0.mlp.linear_fc1.weight"]
    assert main.dtype == torch.float32 and weight.dtype == torch.bfloat16
    assert torch.equal(main.to(torch.bfloat16), weight) and not torch.equal(main, weight.float())


def test_the_vocabulary_is_stored_without_the_rows_that_pad_it_for_tp(moves):
    root, _, _ = moves
    saved = FullTensors(_saved_dir(root, "tp2_to_tp1") / checkpoint.SHARDS, "", meta=True)
    assert saved["model/embedding.word_embeddings.weight"].shape == (cases.DENSE.vocab_size, 64)


def test_a_checkpoint_is_safetensors_and_json_with_no_pickle(moves):
    root, _, _ = moves
    step_dir = _saved_dir(root, "tp2_to_tp1")
    assert (step_dir.parent / "latest").read_text().strip() == step_dir.name == "step_00000002"
    files = sorted(str(p.relative_to(step_dir)) for p in step_dir.rglob("*") if p.is_file())
    assert all(f.endswith((".safetensors", ".json")) for f in files), files
    assert {"rng/rank_00001.safetensors", "shards/index.json"} <= set(files)
    meta = json.loads((step_dir / "meta.json").read_text())
    assert meta["layout"]["tp"] == 2 and meta["optimizer"] == "adamw" and meta["step"] == 2
    assert meta["format"] == checkpoint.FORMAT and set(meta["files"]) == set(files) - {"meta.json"}
    for file in step_dir.rglob("*"):
        assert b"\x80\x04\x95" not in file.read_bytes() if file.is_file() else True  # pickle


def test_format_2_checkpoints_still_resume(moves):
    _, _, format2 = moves
    fixtures = Path(checkpoint_cases.__file__).parent / "format2"
    adamw = json.loads((fixtures / "adamw_tp2" / "expected.json").read_text())["next_losses"]
    distributed = json.loads((fixtures / "distributed_dp2" / "expected.json").read_text())
    for rank in format2:  # AdamW written at TP2, resumed at TP1 x DP2
        torch.testing.assert_close(
            torch.tensor(rank["adamw_tp2_at_dp2"]), torch.tensor(adamw), **cases.SAME_DEVICE_TOL
        )
        assert rank["distributed_dp2"] == pytest.approx(distributed["next_losses"], rel=1e-6)
        refusal = rank["distributed_dp2_at_tp2"]
        assert "format-2 checkpoint" in refusal and "resume at the saved layout" in refusal
        assert "\n" not in refusal


@pytest.fixture(scope="module")
def background(tmp_path_factory):
    root = tmp_path_factory.mktemp("background")
    return root, run_ranks(checkpoint_cases.background_saves, 2, str(root))


def test_a_background_save_returns_at_once_and_holds_its_steps_state_while_training_goes_on(
    background,
):
    root, ranks = background
    assert all(not rank["published_at_return"] for rank in ranks)
    assert ranks[0]["published"] == root / "background" / "step_00000002"
    sync = FullTensors(root / "sync" / "step_00000002" / checkpoint.SHARDS, "")
    written = FullTensors(root / "background" / "step_00000002" / checkpoint.SHARDS, "")
    assert sorted(written) == sorted(sync)
    assert all(torch.equal(written[name], sync[name]) for name in sync)


def test_a_save_leaves_every_storage_resizable_for_allgather_swap(background):
    # Allgather-swap frees the training state with resize_(0) right after a save.
    _, ranks = background
    assert all(rank["resizable_after_save"] for rank in ranks)


def test_a_background_save_that_fails_leaves_latest_on_the_step_before_and_says_so(background):
    root, ranks = background
    step4 = root / "background" / "step_00000004"
    for rank in ranks:  # every rank hears of it, in the same line, naming rank 1's cause
        error = rank["error"]
        assert error.startswith(f"checkpoint {step4} could not be written (rank 1: ")
        assert "No space left on device" in error and "\n" not in error
        assert error.endswith("partial folder is removed and 'latest' still names step_00000002")


def test_a_failed_write_on_one_rank_removes_the_partial_folder_and_the_ranks_stay_in_step(
    background,
):
    root, ranks = background
    for rank in ranks:  # the RNG file of rank 1 failed before DCP ran: both ranks know
        assert "(rank 1: [Errno 13] Permission denied" in rank["sync_error"]
        assert rank["sync_error"].endswith("'latest' still names step_00000002")
        # Neither failed save left a folder behind, and `latest` never moved.
        assert rank["left_after_failures"] == ["latest", "step_00000002"]
    # The same save, once the disk is back, is written by both ranks and published.
    assert ranks[0]["retried"] == root / "background" / "step_00000004"
    assert checkpoint.resolve(root / "background").name == "step_00000004"


def _fake_step(root: Path, step: int, next_iteration: int | None = None) -> Path:
    """A minimal complete step folder written by the real writer's pieces."""
    step_dir = root / f"step_{step:08d}"
    checkpoint.save_tree(step_dir / "model", {"w": torch.arange(4.0)})
    files = {
        str(p.relative_to(step_dir)): p.stat().st_size for p in step_dir.rglob("*") if p.is_file()
    }
    meta = {"format": checkpoint.FORMAT, "files": files}
    if next_iteration is not None:
        meta["data_position"] = {"next_iteration": next_iteration}
    (step_dir / "meta.json").write_text(json.dumps(meta))
    (root / "latest").write_text(step_dir.name + "\n")
    return step_dir


def test_roles_left_at_different_iterations_resume_at_the_newest_one_all_of_them_saved(tmp_path):
    # The critic takes 2 optimizer steps per iteration; the run died between the actor's
    # save of iteration 3 and the critic's.
    for step, iteration in ((2, 2), (3, 3)):
        _fake_step(tmp_path / "actor", step, iteration)
    for step, iteration in ((2, 1), (4, 2)):
        _fake_step(tmp_path / "critic", step, iteration)
    steps = checkpoint.resolve_run(tmp_path, ["actor", "critic"])
    assert steps == {
        "actor": tmp_path / "actor" / "step_00000002",
        "critic": tmp_path / "critic" / "step_00000004",
    }
    _fake_step(tmp_path / "critic", 6, 3)  # once both saved iteration 3, their latest
    assert checkpoint.resolve_run(tmp_path, ["actor", "critic"])["actor"].name == "step_00000003"


def test_keeping_one_checkpoint_never_deletes_the_last_iteration_every_role_saved(tmp_path):
    # keep: 1 and checkpoint.on_error: warn. Both roles saved iteration 2; the actor then
    # saved iteration 3 but the critic's part of it failed: the actor's iteration 2 is the
    # only one the critic's can be resumed with, so it stays.
    _fake_step(tmp_path / "actor", 2, 2)
    _fake_step(tmp_path / "critic", 4, 2)
    _fake_step(tmp_path / "actor", 3, 3)
    assert checkpoint.prune_run(tmp_path, ["actor", "critic"], keep=1) == []
    assert checkpoint.prune_run(tmp_path, ["actor", "critic"], keep=3) == []  # fewer saved
    resumed = checkpoint.resolve_run(tmp_path, ["actor", "critic"])
    assert {role: step.name for role, step in resumed.items()} == {
        "actor": "step_00000002", "critic": "step_00000004",
    }  # fmt: skip
    # Once the critic saved iteration 3 too, iteration 2 is older than the one kept.
    _fake_step(tmp_path / "critic", 6, 3)
    gone = checkpoint.prune_run(tmp_path, ["actor", "critic"], keep=1)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in gone) == [
        "actor/step_00000002", "critic/step_00000004",
    ]  # fmt: skip
    assert [p.name for p in checkpoint.step_dirs(tmp_path / "critic")] == ["step_00000006"]


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
