"""The whole pipeline on the shared 3-node Ray cluster: Ray workers, the dock, the
allgather-swap resharder (training TP=2 over gloo -> generation TP=1) and the hf engine.

These are the slowest tests of the suite (a few seconds of start-up per run, then
~0.3 s per tiny iteration), so each run is as short as what it proves allows.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from mindrl.config import load_config
from mindrl.metrics import read_metrics
from trainers.driver.cli import DEFAULT_CONFIG
from trainers.driver.train import train
from trainers.registry import get_algorithm

NO_VLLM_REASON = "vllm is not importable here: run it in .venv-vllm (scripts/install_vllm_cpu.sh)"

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]


#: One device, one rank per role: for a run whose property does not depend on the layout
#: (a dead worker, a full disk, a raising environment). A process per role and device is
#: most of a run's start-up here; the two-device layout is what the shared runs train.
ONE_DEVICE = ("resources.devices_per_node=1", "actor.parallel.tp=1")

#: The tiny config as a Qwen3-MoE policy trained TP2 x EP2 (sequence parallel).
MOE = (
    "model.family=qwen3_moe",
    "model.num_experts=4",
    "model.moe_ffn_hidden_size=64",
    "model.qk_layernorm=true",
    "actor.parallel.ep=2",
)


def tiny_config(tmp_path: Path, trainer: str = "grpo", *overrides: str):
    return load_config(
        DEFAULT_CONFIG,
        [
            f"logging.dir={tmp_path / 'run'}",
            "logging.progress_bar=false",
            "logging.backends=[]",
            "checkpoint.every=0",
            *overrides,
        ],
        algorithm=get_algorithm(trainer),
    )


def trained_records(run_dir: Path, trainer: str, *overrides: str) -> list[dict]:
    """Train the tiny config with ``overrides`` into ``run_dir``; its metrics records."""
    assert train(tiny_config(run_dir, trainer, *overrides), trainer, "cpu") == 0
    return read_metrics(run_dir / "run" / "metrics.jsonl")


def trained_run(tmp_path_factory: pytest.TempPathFactory, trainer: str, *overrides: str) -> Path:
    """A module's shared run: ``trainer`` on the tiny config with ``overrides``, trained
    into a fresh folder (named after the trainer); the folder, read with :func:`records_of`."""
    run_dir = tmp_path_factory.mktemp(trainer)
    trained_records(run_dir, trainer, *overrides)
    return run_dir


def records_of(run_dir: Path) -> list[dict]:
    """The metrics records of the run trained into ``run_dir``."""
    return read_metrics(run_dir / "run" / "metrics.jsonl")


def resumed_records(whole_dir: Path, run_dir: Path, trainer: str, *overrides: str) -> list[dict]:
    """Resume the run trained into ``whole_dir`` from its first (oldest) checkpoint, with
    the same ``overrides``, into ``run_dir``; the resumed run's metrics records."""
    first = sorted((whole_dir / "run" / "checkpoints" / "actor").glob("step_*"))[0]
    config = tiny_config(run_dir, trainer, *overrides)
    assert train(config, trainer, "cpu", resume=str(first)) == 0
    return read_metrics(run_dir / "run" / "metrics.jsonl")


def rewards(run_dir: Path) -> list[float]:
    return [r["reward_mean"] for r in read_metrics(run_dir / "metrics.jsonl")]


@pytest.mark.long
def test_tiny_grpo_reward_rises_end_to_end(tmp_path):
    config = tiny_config(tmp_path, "grpo", "iterations=70")
    assert train(config, "grpo", device="cpu") == 0
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    curve = [r["reward_mean"] for r in records]
    first, last = sum(curve[:10]) / 10, sum(curve[-10:]) / 10
    assert first <= 0.3
    assert last >= first + 0.25, f"reward did not rise: {first:.3f} -> {last:.3f}"
    # The generation engine samples with exactly the weights being trained.
    assert max(r["rollout_logprob_diff"] for r in records) < 1e-4
    assert (tmp_path / "run" / "checkpoints" / "actor" / "latest").exists()


def test_a_resumed_lora_run_continues_exactly_and_ends_with_its_hf_model_and_adapter(tmp_path):
    """Resume, on a run that trains LoRA adapters (whole runs are the suite's dearest
    tests: one covers both): the resumed run's records are the uninterrupted run's, and it
    ends with the merged model and the PEFT adapter."""
    # checkpoint.async: the step-2 checkpoint is written while iterations 2-3 train.
    # One device: LoRA at TP2 trains like one rank (tests/megatron/test_lora.py).
    lora = (
        "actor.lora.rank=4", "iterations=4", "checkpoint.every=2", "checkpoint.async=true",
        *ONE_DEVICE,
    )  # fmt: skip
    whole = tmp_path / "whole"
    records = trained_records(whole, "grpo", *lora)
    # The engine gets the whole base on the first iteration, then the float32 adapters
    # only, and samples with the policy.
    adapters = 4 * records[0]["trainable_params"]  # float32
    assert [r["handover_bytes"] for r in records[1:]] == [adapters] * 3
    assert records[0]["handover_bytes"] > 10 * adapters
    assert max(r["rollout_logprob_diff"] for r in records) < 1e-4
    expected = records[2:]
    checkpoints = whole / "run" / "checkpoints" / "actor"
    # The steps hold the adapters; the random-init base, drawn per layout, lies once beside.
    assert (checkpoints / "base" / "meta.json").is_file()
    got = resumed_records(whole, tmp_path / "resumed", "grpo", *lora)
    assert [r["iteration"] for r in got] == [2, 3]
    for key in ("reward_mean", "pg_loss", "grad_norm", "entropy"):
        assert [r[key] for r in got] == pytest.approx([r[key] for r in expected], abs=1e-6)
    run = tmp_path / "resumed" / "run"
    # The run ends with the trained policy as an HF folder that transformers loads.
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(run / "hf")
    assert hf.config.num_hidden_layers == 2
    adapter = json.loads((run / "hf_adapter" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str((run / "hf_base").resolve())
    assert (run / "hf_adapter" / "adapter_model.safetensors").is_file()


def test_resume_without_a_checkpoint_is_a_one_line_user_error(tmp_path, capsys):
    config = tiny_config(tmp_path, "grpo", "iterations=2")
    assert train(config, "grpo", device="cpu", resume=True) == 2
    err = capsys.readouterr().err
    assert "no checkpoint under" in err and "Traceback" not in err


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason=NO_VLLM_REASON)
def test_generation_tp2_with_vllm_learns_and_samples_with_the_trained_weights(tmp_path):
    """Training TP2 -> vLLM TP2: each rank loads its own shards; TP rank 0 writes."""
    config = tiny_config(tmp_path, "grpo", "iterations=100", "rollout.engine=vllm", "rollout.tp=2")
    assert train(config, "grpo", device="cpu") == 0
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    curve = [r["reward_mean"] for r in records]
    first, last = sum(curve[:10]) / 10, sum(curve[-10:]) / 10
    assert len(records) == 100
    assert last >= first + 0.2, f"reward did not rise: {first:.3f} -> {last:.3f}"
    assert max(r["rollout_logprob_diff"] for r in records) < 1e-4


def test_a_moe_policy_trained_with_tp2_ep2_generates_with_exactly_its_weights(tmp_path):
    """Qwen3-MoE: sequence-parallel TP2 + EP2 training -> allgather-swap -> hf engine."""
    config = tiny_config(tmp_path, "grpo", "iterations=6", *MOE)
    assert train(config, "grpo", device="cpu") == 0
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert len(records) == 6
    assert max(r["rollout_logprob_diff"] for r in records) < 1e-4


def test_an_uneven_pipeline_generates_with_exactly_its_weights_and_reports_loss_metrics(tmp_path):
    """PP2 with 1 + 2 layers: the last stage's loss metrics reach the record."""
    config = tiny_config(
        tmp_path, "grpo", "iterations=3", "model.num_layers=3", "actor.parallel.tp=1",
        "actor.parallel.pp=2", "actor.parallel.first_stage_layers=1",
    )  # fmt: skip
    assert train(config, "grpo", device="cpu") == 0
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert len(records) == 3
    assert max(r["rollout_logprob_diff"] for r in records) < 1e-4
    assert all(r["entropy"] > 0 for r in records)


def test_an_unknown_verifier_is_a_one_line_user_error_before_any_worker_starts(tmp_path, capsys):
    config = tiny_config(tmp_path, "grpo", "iterations=2", "reward.verifiers=[synthetic,bogus]")
    assert train(config, "grpo", device="cpu") == 2
    err = capsys.readouterr().err
    assert "reward.verifiers: unknown verifier 'bogus'; known: exact, math" in err
    assert "Traceback" not in err


def test_ppo_with_reference_epochs_and_minibatches_runs_every_stage(ppo_records):
    records = ppo_records
    stages = set(records[-1]["time"])
    assert {"ref_logp", "old_logp", "values", "critic_update"} <= stages
    # Two epochs x two mini-batches: the policy moves within the iteration, so the clip
    # and the KL to the reference see a ratio != 1 and log-probs != the reference's.
    assert records[-1]["kl"] > 0
    assert "critic_value_mean" in records[-1]
    # Every role's memory peak is in every record; the actor's ledger holds its weights.
    memory = records[-1]["memory"]
    assert set(memory) == {"actor", "reference", "critic", "reward"}
    assert all(peak["host_peak_mib"] > 100 for peak in memory.values())
    assert memory["actor"]["device_peak_mib"] > 0
    assert "host_peak_mib" not in records[-1]  # booked per role, not averaged as a metric


def test_dapo_refills_dropped_groups_and_says_how_many_batches_it_drew(tmp_path):
    config = tiny_config(
        tmp_path, "dapo", "iterations=2", "algorithm.max_sample_batches=3", *ONE_DEVICE
    )
    assert train(config, "dapo", device="cpu") == 0
    for record in read_metrics(tmp_path / "run" / "metrics.jsonl"):
        assert 1 <= record["sample_batches"] <= 3
        assert 0 <= record["kept_groups"] <= config.data.global_batch_size


def test_a_dead_worker_stops_the_run_within_60_s_naming_worker_and_stage(
    tmp_path, capsys, monkeypatch
):
    import ray

    from mindrl.workers.group import WorkerGroup

    groups, call_each = [], WorkerGroup.call_each

    def recording_call_each(group, *args, **kwargs):  # this run's own workers, never a guess
        groups.append(group)
        return call_each(group, *args, **kwargs)

    monkeypatch.setattr(WorkerGroup, "call_each", recording_call_each)
    config = tiny_config(tmp_path, "grpo", "iterations=200", *ONE_DEVICE)
    outcome = {}
    runner = threading.Thread(
        target=lambda: outcome.setdefault("code", train(config, "grpo", device="cpu"))
    )
    runner.start()
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        assert time.monotonic() < deadline, "the run never started iterating"
        time.sleep(0.2)
    actor = next(group for group in groups if group.name == "actor").workers[0]
    pid = ray.get(actor.__ray_call__.remote(lambda _: os.getpid()))
    assert pid > 1  # never os.kill(0): that is our own group
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    runner.join(timeout=60)
    assert not runner.is_alive(), "the driver hung after a worker died"
    assert time.monotonic() - killed_at < 60
    assert outcome["code"] == 1
    err = capsys.readouterr().err
    assert "died during stage" in err and "actor[" in err
    assert (tmp_path / "run" / "error.log").read_text().startswith("mindrl-train failed at ")
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_ppo_with_a_reward_model_adds_its_score_to_the_rules(tmp_path):
    from tests.rewards.test_reward_model import save_tiny_reward_model

    save_tiny_reward_model(tmp_path / "rm")
    config = tiny_config(
        tmp_path, "ppo", "iterations=2", f"reward.reward_model={tmp_path / 'rm'}",
        "reward.verifiers=[]", *ONE_DEVICE,
    )  # fmt: skip
    assert train(config, "ppo", device="cpu") == 0
    curve = rewards(tmp_path / "run")
    # Rules off: the reward is the classifier's score alone, a real number, never 0.
    assert all(r != 0.0 for r in curve)
