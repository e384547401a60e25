"""Reward / KL / response-length curves of a run, rendered to a PNG, and the largest
worker's peak host memory beside them when the run recorded memory. A run of several
domains gets each domain's reward (``reward/<domain>``) over the mean's.

Console script: ``mindrl-plot RUN_DIR_OR_JSONL [-o out.png]`` (entry point
``mindrl.metrics.plot:main``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mindrl.metrics.logger import METRICS_FILE, read_metrics
from mindrl.metrics.memory import MEMORY_RECORD_KEY
from mindrl.metrics.rewards import DOMAIN_PREFIX, DROPPED_GROUPS, FAILED_SHARE

# (metric key, panel title) of each panel, left to right.
PANELS: tuple[tuple[str, str], ...] = (
    ("reward_mean", "reward (mean)"),
    ("kl", "KL"),
    ("response_length_mean", "response length (tokens)"),
)
#: The panels of an offline preference run (DPO), which has no reward or KL to plot.
PREFERENCE_PANELS: tuple[tuple[str, str], ...] = (
    ("preference_accuracy", "preference accuracy"),
    ("reward_margin", "reward margin (chosen - rejected)"),
    ("loss", "loss"),
)
#: Drawn after the panels when the records carry memory (``record["memory"]``, per role):
#: the largest role's peak host RSS, the curve a soak or leak check reads.
HOST_PEAK_PANEL = ("largest_host_peak_mib", "largest peak host RSS (MiB)")
HOST_PEAK_MIB = "host_peak_mib"  # mindrl.metrics.memory's key of a role's peak host RSS
#: Curves drawn over a panel's own when a run recorded them: validation beside training.
OVERLAYS: dict[str, tuple[str, str]] = {"reward_mean": ("val/reward_mean", "validation")}
FIGURE_SIZE_IN = (12.0, 3.5)
DPI = 100  # -> a 1200 x 350 pixel PNG


def _series(records: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    points = [(r["iteration"], v) for r in records if (v := _value(r, key)) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def _value(record: dict[str, Any], key: str) -> float | None:
    if key == HOST_PEAK_PANEL[0]:
        peaks = [
            role[HOST_PEAK_MIB]
            for role in record.get(MEMORY_RECORD_KEY, {}).values()
            if HOST_PEAK_MIB in role
        ]
        return float(max(peaks)) if peaks else None
    return None if record.get(key) is None else float(record[key])


def plot_metrics(jsonl_path: str | Path, png_path: str | Path) -> Path:
    """Render the reward, KL and response-length curves of a metrics JSONL to a PNG (a
    preference run's: accuracy, reward margin and loss).

    A metric the run did not record gets an empty panel saying so.

    Returns:
        The PNG path.
    """
    import matplotlib

    matplotlib.use("Agg")  # no display on servers; must precede pyplot
    import matplotlib.pyplot as plt

    records = read_metrics(jsonl_path)
    preference = any("preference_accuracy" in r for r in records)
    panels = PREFERENCE_PANELS if preference else PANELS
    if any(_value(r, HOST_PEAK_PANEL[0]) is not None for r in records):
        panels = (*panels, HOST_PEAK_PANEL)
    figure, axes = plt.subplots(1, len(panels), figsize=FIGURE_SIZE_IN, dpi=DPI)
    for axis, (key, title) in zip(axes, panels, strict=True):
        iterations, values = _series(records, key)
        if values:
            axis.plot(iterations, values, marker="." if len(values) < 50 else None)
        else:
            axis.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=axis.transAxes)
        _overlay(axis, records, key)
        axis.set_title(title)
        axis.set_xlabel("iteration")
        axis.grid(alpha=0.3)
    figure.suptitle(str(jsonl_path), fontsize=8)
    figure.tight_layout()
    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png_path, dpi=DPI)
    plt.close(figure)
    return png_path


def _overlay(axis: Any, records: Sequence[dict[str, Any]], key: str) -> None:
    """Draw ``OVERLAYS[key]`` (e.g. validation reward) over the panel, when recorded, and
    over the reward each domain's when the run has several."""
    overlay, label = OVERLAYS.get(key, (None, ""))
    curves = [(overlay, label)] if overlay else []
    if key == "reward_mean":
        curves += [(f"{DOMAIN_PREFIX}{d}", d) for d in domains_of(records)]
    drawn = False
    for name, label in curves:
        iterations, values = _series(records, name)
        if values:
            dashed = name == overlay
            axis.plot(iterations, values, linestyle="--" if dashed else ":", label=label)
            drawn = True
    if drawn:
        axis.legend(fontsize=7)


def domains_of(records: Sequence[dict[str, Any]]) -> list[str]:
    """The domains a run recorded a reward of, when there are several (one domain's curve
    is the mean's)."""
    keys = {k for r in records for k in r if k.startswith(DOMAIN_PREFIX)}
    domains = sorted(k.removeprefix(DOMAIN_PREFIX) for k in keys - {FAILED_SHARE, DROPPED_GROUPS})
    return domains if len(domains) > 1 else []


def _resolve_jsonl(target: Path) -> Path:
    jsonl = target / METRICS_FILE if target.is_dir() else target
    if not jsonl.is_file():
        raise FileNotFoundError(f"no metrics file at {jsonl}; give a run folder or a .jsonl")
    return jsonl


def main(argv: Sequence[str] | None = None) -> int:
    """``mindrl-plot RUN_DIR_OR_JSONL [-o out.png]``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="mindrl-plot", description="Plot reward / KL / response-length curves of a run."
    )
    parser.add_argument("target", type=Path, help="run folder (with metrics.jsonl) or a .jsonl")
    parser.add_argument("-o", "--output", type=Path, help="PNG path (default: beside the JSONL)")
    args = parser.parse_args(argv)
    try:
        jsonl = _resolve_jsonl(args.target)
        png = plot_metrics(jsonl, args.output or jsonl.with_suffix(".png"))
    except (FileNotFoundError, ValueError) as error:
        print(f"mindrl-plot: {error}", file=sys.stderr)
        return 2
    print(png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
