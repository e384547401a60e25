"""Metrics logger: JSONL round trip, TensorBoard / W&B / MLflow scalars, resume truncation."""

from __future__ import annotations

import json
import struct
import time

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from mindrl.config import ConfigError, load_config
from mindrl.metrics import MetricsLogger, flatten_scalars, read_metrics
from mindrl.metrics.sinks import (
    SINKS,
    SinkError,
    SinkKind,
    SinkSettings,
    WandbSink,
    missing_sink_packages,
)
from trainers.driver.cli import main as cli_main


def _record(iteration):
    return {
        "reward_mean": 0.1 * iteration,
        "kl": torch.tensor(0.5 * iteration),
        "entropy": np.float32(1.25),
        "time": {"rollout": 2.0, "update": 1.5},
        "note": "text is kept in JSON only",
    }


def test_jsonl_round_trips_one_line_per_iteration_and_is_flushed_each_time(tmp_path):
    logger = MetricsLogger(tmp_path, backends=())
    logger.log(1, _record(1))
    # Flushed before close: a crashed run keeps what it logged.
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["reward_mean"] == 0.1
    logger.log(2, _record(2))
    logger.close()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["iteration"] for r in records] == [1, 2]
    assert records[1] == {
        "iteration": 2,
        "reward_mean": 0.2,
        "kl": 1.0,
        "entropy": 1.25,
        "time": {"rollout": 2.0, "update": 1.5},
        "note": "text is kept in JSON only",
    }


def test_nested_metrics_flatten_to_slash_tags_and_skip_non_numbers():
    tags = dict(flatten_scalars(_record(2)))
    assert tags == {
        "reward_mean": 0.2,
        "kl": 1.0,
        "entropy": 1.25,
        "time/rollout": 2.0,
        "time/update": 1.5,
    }
    assert dict(flatten_scalars({"nan": float("nan"), "flag": True})) == {}


def test_tensorboard_receives_every_scalar_at_its_iteration(tmp_path):
    with MetricsLogger(tmp_path) as logger:
        for iteration in (1, 2, 3):
            logger.log(iteration, _record(iteration))
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert "time/rollout" in events.Tags()["scalars"]
    kl = [(e.step, e.value) for e in events.Scalars("kl")]
    assert kl == [(1, 0.5), (2, 1.0), (3, 1.5)]


def test_resume_keeps_iterations_before_the_checkpoint_only(tmp_path):
    with MetricsLogger(tmp_path, backends=()) as logger:
        for iteration in range(1, 6):
            logger.log(iteration, {"reward_mean": iteration})
    with MetricsLogger(tmp_path, backends=(), resume_at=4) as logger:
        logger.log(4, {"reward_mean": 40})
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["iteration"], r["reward_mean"]) for r in records] == [
        (1, 1),
        (2, 2),
        (3, 3),
        (4, 40),
    ]


def test_an_unknown_backend_is_refused_by_the_config_naming_the_choices():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["logging.backends=[tensorboard, neptune]"])
    assert err.value.problems == [
        "<defaults>: logging.backends: 'neptune' is not one of: tensorboard, wandb, mlflow"
    ]


def test_a_listed_sink_that_is_not_installed_is_one_line_with_the_pip_command(monkeypatch, capsys):
    monkeypatch.setitem(SINKS, "wandb", SinkKind("mindrl_absent_package", "wandb", WandbSink))
    assert missing_sink_packages(["tensorboard"]) == []
    expected = (
        "logging.backends: 'wandb' is listed but its package is not installed; "
        "pip install wandb (or pip install 'mindrl[loggers]')"
    )
    assert missing_sink_packages(["tensorboard", "wandb"]) == [expected]
    # mindrl-train refuses it before any process starts: exit 2, one line.
    assert cli_main(["--trainer", "grpo", "--device", "cpu", "logging.backends=[wandb]"]) == 2
    assert capsys.readouterr().err == f"mindrl-train: config error: {expected}\n"


def _wandb_records(path):
    """The records of a W&B ``.wandb`` log: a 7-byte header, then records of crc32 (4
    bytes), length (2, little-endian), type (1) and a protobuf ``Record``. A small run fits
    in the log's first 32 KiB block, so no record is split."""
    from wandb.proto import wandb_internal_pb2

    raw = path.read_bytes()
    assert raw[:4] == b":W&B" and len(raw) < 32768
    records, pos = [], 7
    while pos + 7 <= len(raw):
        length, kind = struct.unpack_from("<HB", raw, pos + 4)
        if kind == 0:
            break
        records.append(wandb_internal_pb2.Record())
        records[-1].ParseFromString(raw[pos + 7 : pos + 7 + length])
        pos += 7 + length
    return records


def _wandb_history(run_dir, timeout_s=60.0):
    """The history rows of a finished offline W&B run, once its log is complete.

    W&B's service process writes the log after ``finish()`` returns (at the latest when the
    process exits), so wait for the run's ``exit`` record.
    """
    (path,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    deadline = time.monotonic() + timeout_s
    while not (records := _wandb_records(path)) or records[-1].WhichOneof("record_type") != "exit":
        assert time.monotonic() < deadline, f"{path} has no exit record after {timeout_s}s"
        time.sleep(0.2)
    histories = [r.history.item for r in records if r.WhichOneof("record_type") == "history"]
    return [
        {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in h} for h in histories
    ]


def test_wandb_offline_records_every_scalar_at_its_iteration(tmp_path):
    pytest.importorskip("wandb")
    run_dir = tmp_path / "run"
    with MetricsLogger(run_dir, backends=["wandb"], settings=SinkSettings("t")) as logger:
        for iteration in (1, 2, 3):
            logger.log(iteration, _record(iteration))
    rows = _wandb_history(run_dir)
    assert [(r["_step"], r["kl"], r["time/rollout"]) for r in rows] == [
        (1, 0.5, 2.0),
        (2, 1.0, 2.0),
        (3, 1.5, 2.0),
    ]
    assert all("note" not in r for r in rows)  # text stays in metrics.jsonl


def test_mlflow_records_every_scalar_at_its_iteration_in_the_run_folder(tmp_path):
    pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy")  # MLflow's local store is a SQLite database
    from mlflow.tracking import MlflowClient

    with MetricsLogger(tmp_path, backends=["mlflow"], settings=SinkSettings("exp")) as logger:
        for iteration in (1, 2, 3):
            logger.log(iteration, _record(iteration))
        run_id = logger._sinks[0].run_id
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    history = client.get_metric_history(run_id, "kl")
    assert [(m.step, m.value) for m in history] == [(1, 0.5), (2, 1.0), (3, 1.5)]
    assert [m.value for m in client.get_metric_history(run_id, "time/rollout")] == [2.0] * 3
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == tmp_path.name
    assert client.get_experiment(run.info.experiment_id).name == "exp"


def test_a_sink_that_cannot_start_is_one_line_and_touches_no_metrics(tmp_path):
    pytest.importorskip("mlflow")
    (tmp_path / "metrics.jsonl").write_text('{"iteration": 0}\n')
    settings = SinkSettings(mlflow_uri="nosuchscheme://host/path")
    with pytest.raises(SinkError) as err:
        MetricsLogger(tmp_path, backends=["tensorboard", "mlflow"], settings=settings)
    assert str(err.value).startswith("logging.backends: mlflow could not start: ")
    assert "\n" not in str(err.value)
    assert (tmp_path / "metrics.jsonl").read_text() == '{"iteration": 0}\n'


def test_the_logging_section_hands_the_sinks_their_settings():
    from mindrl.config.schema import LoggingConfig

    section = LoggingConfig(project="p", wandb_mode="online", mlflow_uri="sqlite:///m.db")
    assert section.sink_settings() == SinkSettings("p", "online", "sqlite:///m.db")
