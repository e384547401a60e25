"""Metric sinks beside ``metrics.jsonl``: TensorBoard, Weights & Biases and MLflow.

``logging.backends`` lists the sinks of a run. Each is imported only when listed, so a
run that does not use W&B or MLflow never needs them installed, and
:func:`missing_sink_packages` names a listed one that is not installed, with the pip
command, before any worker starts. ``metrics.jsonl`` is not a sink: it is always written
because ``--resume`` and the plots read it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

TENSORBOARD_DIR = "tensorboard"
#: MLflow's own default store; its plain-folder store ("./mlruns") refuses new runs.
MLFLOW_DB = "mlflow.db"


class SinkError(ValueError):
    """A listed sink that could not start (not logged in, bad URI): one line."""


@dataclass(frozen=True)
class SinkSettings:
    """What the W&B and MLflow sinks need beyond the run folder (``logging.*``)."""

    project: str = "mindrl"  # W&B project, MLflow experiment
    wandb_mode: str = "offline"  # offline: RUN_DIR/wandb, uploaded later by `wandb sync`
    mlflow_uri: str | None = None  # None: $MLFLOW_TRACKING_URI, else RUN_DIR/mlflow.db


class Sink(Protocol):
    def log(self, iteration: int, scalars: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


class TensorBoardSink:
    """Scalars under ``RUN_DIR/tensorboard``, flushed every iteration."""

    def __init__(self, run_dir: Path, settings: SinkSettings) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(run_dir / TENSORBOARD_DIR))

    def log(self, iteration: int, scalars: Mapping[str, float]) -> None:
        for tag, value in scalars.items():
            self._writer.add_scalar(tag, value, global_step=iteration)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """A W&B run named after the run folder, its files under ``RUN_DIR/wandb``."""

    def __init__(self, run_dir: Path, settings: SinkSettings) -> None:
        import wandb

        # console="off": W&B would otherwise wrap stdout / stderr to capture them, and
        # the progress bar asks those streams whether they are a terminal.
        self._run = wandb.init(
            project=settings.project,
            name=run_dir.name,
            dir=str(run_dir),
            mode=settings.wandb_mode,
            settings=wandb.Settings(console="off", silent=True),
        )
        if settings.wandb_mode == "offline":
            folder = Path(self._run.dir).parent  # run.dir is the run's files/ folder
            _say(f"W&B offline run in {folder} (upload it with: wandb sync {folder})")
        else:
            _say(f"W&B run {self._run.url}")

    def log(self, iteration: int, scalars: Mapping[str, float]) -> None:
        self._run.log(dict(scalars), step=iteration)

    def close(self) -> None:
        self._run.finish()


class MlflowSink:
    """An MLflow run in experiment ``project``, through a client (no global MLflow state)."""

    def __init__(self, run_dir: Path, settings: SinkSettings) -> None:
        from mlflow.tracking import MlflowClient

        uri = settings.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI")
        uri = uri or f"sqlite:///{(run_dir / MLFLOW_DB).resolve()}"
        self._client = MlflowClient(tracking_uri=uri)
        experiment = self._client.get_experiment_by_name(settings.project)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self._client.create_experiment(settings.project)
        )
        run = self._client.create_run(experiment_id, run_name=run_dir.name)
        self.run_id = run.info.run_id
        _say(f"MLflow run {self.run_id} in experiment '{settings.project}' at {uri}")

    def log(self, iteration: int, scalars: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        metrics = [Metric(tag, value, stamp, iteration) for tag, value in scalars.items()]
        self._client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


@dataclass(frozen=True)
class SinkKind:
    module: str  # imported by the sink; its absence is reported before the run starts
    requirement: str  # what to pip install
    build: Callable[[Path, SinkSettings], Sink]


#: The names ``logging.backends`` accepts.
SINKS: dict[str, SinkKind] = {
    "tensorboard": SinkKind("tensorboard", "tensorboard", TensorBoardSink),
    "wandb": SinkKind("wandb", "wandb", WandbSink),
    "mlflow": SinkKind("mlflow", "mlflow", MlflowSink),
}


def missing_sink_packages(names: Sequence[str]) -> list[str]:
    """One line per listed sink whose package is not installed (nothing is imported)."""
    return [
        f"logging.backends: '{name}' is listed but its package is not installed; "
        f"pip install {SINKS[name].requirement} (or pip install 'mindrl[loggers]')"
        for name in names
        if importlib.util.find_spec(SINKS[name].module) is None
    ]


def open_sinks(names: Sequence[str], run_dir: Path, settings: SinkSettings) -> list[Sink]:
    """Start the listed sinks; a failure closes the ones started and raises SinkError."""
    started: list[Sink] = []
    for name in dict.fromkeys(names):  # a name listed twice is one sink
        try:
            started.append(SINKS[name].build(run_dir, settings))
        except Exception as exc:  # any library's failure becomes one line naming the sink
            for sink in started:
                sink.close()
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise SinkError(f"logging.backends: {name} could not start: {first}") from exc
    return started


def _say(line: str) -> None:
    print(f"logging: {line}", file=sys.stderr, flush=True)
