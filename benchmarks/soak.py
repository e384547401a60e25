"""Soak check: run any config for N iterations, print memory per role per iteration and
its slope, and fail when a role's memory keeps growing after warm-up.

Every iteration's record carries, per role, the largest worker's peak host RSS and peak
device memory (``mindrl.metrics.memory``). After ``--warmup`` iterations (optimizer
state, swap buffers and the first generation allocate once) a run that holds no stray
references is flat; the least-squares slope in MiB per iteration over the rest says how
far it is from flat, and the growth from the first measured iteration to the last says
how much it cost. Exit code 1 when a role's host memory grows faster than
``--max-slope-mib`` per iteration *and* that slope adds up to more than ``--max-growth``
of its size over the measured iterations (a few MiB of noise on a 6 GiB worker over a
handful of iterations is not a leak; the same slope over 200 iterations is).

    python benchmarks/soak.py --config configs/smollm2_135m.yaml --iterations 200 --warmup 10
    python benchmarks/soak.py --iterations 30 model.hidden_size=384   # tiny config
    python benchmarks/soak.py --from-run runs/smollm2-grpo            # an existing run

A run it starts is also sampled from outside, every ``--sample-s`` seconds: the resident
size of every process of the run (this driver and its descendants: Ray's processes and
the workers) and the machine's used memory (total less available). It prints the peak of
each over the measured iterations and over the end-of-run checkpoint and HF export, and
how far the latter goes above the former: what the end of a run costs in memory.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mindrl.metrics import read_metrics
from mindrl.metrics.memory import MEMORY_RECORD_KEY

KEYS = (("host_peak_mib", "host"), ("device_peak_mib", "device"))


@dataclass(frozen=True)
class RoleTrend:
    """One role's memory key over the measured iterations."""

    role: str
    key: str
    first_mib: float
    last_mib: float
    slope_mib: float  # least squares, MiB per iteration
    iterations: int  # measured (after warm-up)

    @property
    def fitted_growth(self) -> float:
        """What the slope adds up to over the measured iterations, as a fraction."""
        return self.slope_mib * (self.iterations - 1) / self.first_mib if self.first_mib else 0.0

    @property
    def growth(self) -> float:
        """Growth from the first measured iteration to the last, as a fraction."""
        return (self.last_mib - self.first_mib) / self.first_mib if self.first_mib else 0.0


def slope(values: Sequence[float]) -> float:
    """Least-squares slope of ``values`` against their index (0 for fewer than 2)."""
    n = len(values)
    if n < 2:
        return 0.0
    mean_x, mean_y = (n - 1) / 2, sum(values) / n
    covariance = sum((i - mean_x) * (v - mean_y) for i, v in enumerate(values))
    return covariance / sum((i - mean_x) ** 2 for i in range(n))


def memory_trends(records: Sequence[Mapping[str, Any]], warmup: int) -> list[RoleTrend]:
    """Per role and memory key, the trend over the records after ``warmup``.

    Raises:
        ValueError: fewer than two records after warm-up carry memory.
    """
    measured = [r[MEMORY_RECORD_KEY] for r in records[warmup:] if r.get(MEMORY_RECORD_KEY)]
    if len(measured) < 2:
        raise ValueError(
            f"{len(measured)} iteration(s) with memory after {warmup} warm-up iterations; "
            "run more iterations or lower --warmup"
        )
    trends = []
    for role in measured[-1]:
        for key, _ in KEYS:
            series = [m[role][key] for m in measured if key in m.get(role, {})]
            if len(series) >= 2:
                trend = RoleTrend(role, key, series[0], series[-1], slope(series), len(series))
                trends.append(trend)
    return trends


def print_table(records: Sequence[Mapping[str, Any]]) -> None:
    """One line per iteration: every role's host / device peak in MiB."""
    for index, record in enumerate(records):
        memory = record.get(MEMORY_RECORD_KEY) or {}
        cells = [
            f"{role} {label} {peak[key]:8.1f}"
            for role, peak in memory.items()
            for key, label in KEYS
            if key in peak
        ]
        print(f"iter {record.get('iteration', index):>4} | " + " | ".join(cells))


def failing(
    trends: Sequence[RoleTrend], max_slope_mib: float, max_growth: float
) -> list[RoleTrend]:
    """Host trends steeper than ``max_slope_mib`` whose fitted growth exceeds ``max_growth``."""
    return [
        t
        for t in trends
        if t.key == "host_peak_mib" and t.slope_mib > max_slope_mib and t.fitted_growth > max_growth
    ]


def report(
    records: Sequence[Mapping[str, Any]],
    warmup: int,
    max_slope_mib: float,
    max_growth: float = 0.02,
) -> int:
    """Print the table and the trends; 1 when a role grows faster than allowed."""
    print_table(records)
    trends = memory_trends(records, warmup)
    print(f"after {warmup} warm-up iterations ({len(records) - warmup} measured):")
    for t in trends:
        print(
            f"  {t.role:>9} {t.key:<15} {t.first_mib:9.1f} -> {t.last_mib:9.1f} MiB "
            f"({t.growth:+.1%}), slope {t.slope_mib:+.2f} MiB/iteration"
        )
    bad = failing(trends, max_slope_mib, max_growth)
    for t in bad:
        print(f"FAIL: {t.role} host memory grows {t.slope_mib:.2f} MiB/iteration, "
              f"{t.fitted_growth:.1%} over {t.iterations} iterations "
              f"(allowed {max_slope_mib} MiB/iteration or {max_growth:.0%})")  # fmt: skip
    return 1 if bad else 0


@dataclass
class RunMemory:
    """Samples of the run's memory, each tagged with the phase the driver was in."""

    interval_s: float
    phase: str = "start-up"
    samples: list[tuple[str, int, int]] = field(default_factory=list)  # phase, run, machine
    _stop: threading.Event = field(default_factory=threading.Event)

    def sample(self) -> None:
        import psutil

        me = psutil.Process()
        run = 0
        for process in [me, *me.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):  # a process that just ended
                run += process.memory_info().rss
        machine = psutil.virtual_memory()
        self.samples.append((self.phase, run, machine.total - machine.available))

    def loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    @contextlib.contextmanager
    def running(self) -> Iterator[RunMemory]:
        thread = threading.Thread(target=self.loop, name="run-memory", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join()

    def peaks(self, phases: Sequence[str]) -> tuple[int, int] | None:
        """The run's and the machine's peak over the samples of ``phases``."""
        chosen = [(run, machine) for phase, run, machine in self.samples if phase in phases]
        if not chosen:
            return None
        return max(r for r, _ in chosen), max(m for _, m in chosen)


def phased(memory: RunMemory, warmup: int) -> dict[tuple[Any, str], Any]:
    """Wrappers of the driver's pieces that tell each sample its phase: an iteration (those
    from ``warmup`` on are measured) begins when the one before is logged; then the
    end-of-run checkpoint and the HF export."""
    import trainers.driver.train as driver

    log = driver.MetricsLogger.log
    save, write_hf = driver.save_checkpoint, driver._write_hf
    memory.phase = "iterations" if warmup == 0 else "warm-up"

    def logged(logger, iteration, *args, **kwargs):
        result = log(logger, iteration, *args, **kwargs)
        memory.phase = "iterations" if iteration + 1 >= warmup else "warm-up"
        return result

    def in_phase(name, function):
        def call(*args, **kwargs):
            before, memory.phase = memory.phase, name
            try:
                return function(*args, **kwargs)
            finally:
                memory.phase = "after" if name == "export" else before

        return call

    return {
        (driver.MetricsLogger, "log"): logged,
        (driver, "save_checkpoint"): in_phase("checkpoint", save),
        (driver, "_write_hf"): in_phase("export", write_hf),
    }


def report_end_of_run(memory: RunMemory) -> None:
    """The end-of-run checkpoint + export peak against the measured iterations' peak."""
    training, end = memory.peaks(["iterations"]), memory.peaks(["checkpoint", "export"])
    if training is None or end is None:
        print("run memory: too few samples to compare the end of the run with its iterations")
        return
    gib = 2**30
    print(
        f"run memory (every process of the run, RSS): iterations' peak {training[0] / gib:.2f} "
        f"GiB, end-of-run checkpoint + HF export {end[0] / gib:.2f} GiB "
        f"({(end[0] - training[0]) / gib:+.2f} GiB); the machine's used memory "
        f"{training[1] / gib:.2f} -> {end[1] / gib:.2f} GiB ({(end[1] - training[1]) / gib:+.2f})"
    )


def run_config(
    config_path: str | None,
    trainer: str,
    iterations: int,
    overrides: list[str],
    memory: RunMemory | None = None,
    warmup: int = 0,
):
    """Train ``config_path`` for ``iterations``; returns the run folder. With ``memory``, the
    run's memory is sampled meanwhile, by phase."""
    from mindrl.config import load_config
    from trainers.driver.cli import DEFAULT_CONFIG
    from trainers.driver.train import train
    from trainers.registry import get_algorithm

    config = load_config(
        config_path or DEFAULT_CONFIG,
        [f"iterations={iterations}", "checkpoint.every=0", *overrides],
        algorithm=get_algorithm(trainer),
    )
    with contextlib.ExitStack() as stack:
        if memory is not None:
            # Instrumentation only: each wrapper calls the real function, tagging the phase.
            stack.enter_context(_patched(phased(memory, warmup)))
            stack.enter_context(memory.running())
        code = train(config, trainer)
    if code != 0:
        raise SystemExit(code)
    return Path(config.logging.dir.format(trainer=trainer))


@contextlib.contextmanager
def _patched(wrappers: Mapping[tuple[Any, str], Any]) -> Iterator[None]:
    saved = {key: getattr(*key) for key in wrappers}
    for (owner, name), wrapper in wrappers.items():
        setattr(owner, name, wrapper)
    try:
        yield
    finally:
        for (owner, name), original in saved.items():
            setattr(owner, name, original)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. model.hidden_size=384")
    parser.add_argument("--config", help="config file (default: the embedded tiny config)")
    parser.add_argument("--trainer", default="grpo")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument(
        "--max-slope-mib",
        type=float,
        default=1.0,
        help="fail above this host growth per iteration (MiB)...",
    )
    parser.add_argument("--max-growth", type=float, default=0.02,
                        help="...when it also adds up to more than this fraction")  # fmt: skip
    parser.add_argument("--from-run", help="analyse this run folder's metrics instead")
    parser.add_argument("--sample-s", type=float, default=0.25,
                        help="seconds between samples of the run's memory")  # fmt: skip
    args = parser.parse_args(argv)
    memory = None if args.from_run else RunMemory(args.sample_s)
    run_dir = (
        Path(args.from_run)
        if args.from_run
        else run_config(
            args.config, args.trainer, args.iterations, args.overrides, memory, args.warmup
        )
    )
    records = read_metrics(run_dir / "metrics.jsonl")
    code = report(records, args.warmup, args.max_slope_mib, args.max_growth)
    if memory is not None:
        report_end_of_run(memory)
    return code


if __name__ == "__main__":
    sys.exit(main())
