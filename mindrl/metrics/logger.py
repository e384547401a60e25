"""Per-iteration metrics to a JSONL file and the listed sinks (TensorBoard, W&B, MLflow),
flushed every iteration.

A record is a flat or nested dict of numbers; nested dicts (``{"time": {"rollout":
1.2}}``) stay nested in JSON and become ``time/rollout`` tags in the sinks. Flushing each
iteration means a crashed or interrupted run keeps every iteration it finished.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from mindrl.metrics.sinks import SinkSettings, open_sinks

METRICS_FILE = "metrics.jsonl"


def flatten_scalars(record: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """``(tag, value)`` for every finite number in ``record``, nested keys joined by '/'."""
    for key, value in record.items():
        tag = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from flatten_scalars(value, prefix=f"{tag}/")
        elif (scalar := _as_scalar(value)) is not None:
            yield tag, scalar


def _as_scalar(value: Any) -> float | None:
    # Numpy scalars are numbers.Real; one-element tensors arrive from workers.
    if isinstance(value, bool):
        return None
    if hasattr(value, "numel") and value.numel() == 1:
        value = value.item()
    if isinstance(value, numbers.Real) and math.isfinite(value):
        return float(value)
    return None


def _json_default(value: Any) -> Any:
    # Tensors and numpy values arrive from workers; store plain numbers / lists.
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"metric value of type {type(value).__name__} is not JSON-serialisable")


class MetricsLogger:
    """Writes ``<run_dir>/metrics.jsonl`` and every listed sink (:mod:`mindrl.metrics.sinks`).

    Args:
        run_dir: Run folder (created).
        backends: Sinks besides the JSONL file: ``tensorboard``, ``wandb``, ``mlflow``.
        resume_at: Resuming at this iteration: keep the file's records of earlier
            iterations and drop later ones (written after the checkpoint); None starts
            the file afresh. (W&B and MLflow start a new run that begins at it.)
        settings: W&B project / mode and MLflow URI.

    Raises:
        SinkError: a listed sink could not start (one line naming it).
    """

    def __init__(
        self,
        run_dir: str | Path,
        backends: Sequence[str] = ("tensorboard",),
        resume_at: int | None = None,
        settings: SinkSettings | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = self.run_dir / METRICS_FILE
        self._sinks = open_sinks(backends, self.run_dir, settings or SinkSettings())
        kept = self._records_before(resume_at)
        self._file = self.jsonl_path.open("w", encoding="utf-8")
        for record in kept:
            self._file.write(json.dumps(record) + "\n")

    def _records_before(self, resume_at: int | None) -> list[dict[str, Any]]:
        if resume_at is None or not self.jsonl_path.exists():
            return []
        return [r for r in read_metrics(self.jsonl_path) if r["iteration"] < resume_at]

    def log(self, iteration: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Record one iteration's metrics; returns the JSON record written."""
        record = {"iteration": iteration, **metrics}
        self._file.write(json.dumps(record, default=_json_default) + "\n")
        self._file.flush()
        if self._sinks:
            scalars = dict(flatten_scalars(metrics))
            for sink in self._sinks:
                sink.log(iteration, scalars)
        return record

    def close(self) -> None:
        """Flush and close the file and every sink."""
        self._file.close()
        for sink in self._sinks:
            sink.close()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def read_metrics(jsonl_path: str | Path) -> list[dict[str, Any]]:
    """The records of a metrics JSONL file, in order.

    Raises:
        ValueError: a line that is not JSON (the message names it).
    """
    records = []
    with Path(jsonl_path).open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(f"{jsonl_path}:{number}: bad JSON ({error.msg})") from None
    return records
