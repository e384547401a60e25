"""Run metrics: JSONL + TensorBoard logging, progress lines, TPS (Eq. 5), curve plots.

``mindrl.metrics.plot`` (matplotlib) is imported only by who plots.
"""

from mindrl.metrics.logger import METRICS_FILE, MetricsLogger, flatten_scalars, read_metrics
from mindrl.metrics.progress import (
    PROGRESS_FIELDS,
    format_progress_line,
    generation_progress,
    mean_tps,
    print_progress_line,
    tokens_per_second,
)
from mindrl.metrics.reduce import mean_by_key

__all__ = [
    "METRICS_FILE",
    "PROGRESS_FIELDS",
    "MetricsLogger",
    "flatten_scalars",
    "format_progress_line",
    "generation_progress",
    "mean_by_key",
    "mean_tps",
    "print_progress_line",
    "read_metrics",
    "tokens_per_second",
]
