"""Figures of benchmarks/e2e.py: per-system summaries, mindrl / TRL ratios, text and PNG.

A run's records carry mindrl's metrics.jsonl keys (TRL's are made to match):
``iteration``, ``reward_mean``, ``iteration_time_s``, ``prompt_length_mean``,
``response_length_mean`` and, for mindrl, ``time`` = {stage: seconds}.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mindrl.metrics import tokens_per_second

GOAL_THROUGHPUT_RATIO = 1.0  # mindrl throughput >= 1.0x TRL's on the same machine


def cumulative_times(records: Sequence[dict]) -> list[float]:
    """Wall time since the first iteration began, at the end of each iteration."""
    total, times = 0.0, []
    for record in records:
        total += float(record["iteration_time_s"])
        times.append(total)
    return times


def time_to_threshold(
    rewards: Sequence[float], times: Sequence[float], threshold: float, smooth: int
) -> float | None:
    """Wall time when the trailing mean of ``smooth`` rewards first reaches ``threshold``."""
    for end in range(len(rewards)):
        window = rewards[max(0, end + 1 - smooth) : end + 1]
        if sum(window) / len(window) >= threshold:
            return times[end]
    return None


def record_tps(record: dict, settings: dict, n_devices: int) -> float:
    """Eq. 5 for one iteration: G*N*(L_p + L_r) / (n_devices * T_iter)."""
    return tokens_per_second(
        settings["G"],
        settings["N"],
        float(record["prompt_length_mean"]),
        float(record["response_length_mean"]),
        n_devices,
        float(record["iteration_time_s"]),
    )


def median_stages(records: Sequence[dict]) -> dict[str, float]:
    """Median seconds of every stage mindrl timed (empty for TRL)."""
    names = [name for record in records for name in record.get("time") or {}]
    ordered = list(dict.fromkeys(names))
    return {
        name: statistics.median(
            float(r["time"][name]) for r in records if name in r.get("time", {})
        )
        for name in ordered
    }


def median_overhead(records: Sequence[dict]) -> dict[str, float]:
    """Median seconds mindrl spent outside compute (dock, reshard, scheduling)."""
    keys = ("dock_s", "reshard_s", "scheduling_s")
    with_overhead = [r["overhead"] for r in records if isinstance(r.get("overhead"), dict)]
    if not with_overhead:
        return {}
    return {key: statistics.median(float(o.get(key, 0.0)) for o in with_overhead) for key in keys}


# Per-iteration series kept in the JSON: the reward curve and what explains it.
CURVE_KEYS = ("reward_mean", "entropy", "grad_norm", "response_length_mean")


def curve_of(records: Sequence[dict]) -> dict[str, list]:
    """Wall time and every recorded CURVE_KEYS series, one value per iteration."""
    curve: dict[str, list] = {"wall_s": cumulative_times(records)}
    for key in CURVE_KEYS:
        values = [None if r.get(key) is None else float(r[key]) for r in records]
        if any(value is not None for value in values):
            curve[key] = values
    return curve


def tail_mean_and_error(rewards: Sequence[float]) -> tuple[float, float]:
    """Mean reward of the last quarter of the run (>= 3 iterations) and its standard error."""
    tail = rewards[-max(3, len(rewards) // 4) :]
    error = statistics.stdev(tail) / len(tail) ** 0.5 if len(tail) > 1 else 0.0
    return statistics.fmean(tail), error


def summarize(outcome: dict, settings: dict, args: Any) -> dict:
    """The figures of one system's run (timings over the iterations after warm-up)."""
    records = outcome.get("records") or []
    timed = records[args.warmup :]
    if not timed:
        failure = outcome.get("error", "the run ended")
        return {"error": f"{failure}; {len(records)} iterations recorded, none after warm-up"}
    curve = curve_of(records)
    rewards, times = curve["reward_mean"], curve["wall_s"]
    final, final_error = tail_mean_and_error(rewards)
    n_devices = int(outcome["n_devices"])
    return {
        **({"incomplete": outcome["error"]} if "error" in outcome else {}),
        "iterations_recorded": len(records),
        "timed_iterations": len(timed),
        "iteration_time_median_s": statistics.median(float(r["iteration_time_s"]) for r in timed),
        "tps_eq5": statistics.fmean(record_tps(r, settings, n_devices) for r in timed),
        "tps_machine": statistics.fmean(record_tps(r, settings, 1) for r in timed),
        "n_devices": n_devices,
        "torch_threads": outcome.get("threads"),  # TRL's process; mindrl's ranks: Ray's
        "setup_s": float(outcome["total_s"]) - times[-1],
        "reward_first": rewards[0],
        "reward_final": final,
        "reward_final_se": final_error,
        "time_to_threshold_s": time_to_threshold(
            rewards, times, settings["threshold"], args.smooth
        ),
        "stage_median_s": median_stages(timed),
        "overhead_median_s": median_overhead(timed),
        "curve": curve,
    }


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def compare(systems: dict[str, dict], args: Any) -> dict:
    """mindrl / TRL ratios and the goal verdict (empty unless both runs succeeded)."""
    mine, theirs = systems.get("mindrl"), systems.get("trl")
    if not mine or not theirs or "error" in mine or "error" in theirs:
        return {}
    throughput = mine["tps_machine"] / theirs["tps_machine"]
    # Sampling noise: the tails' means may differ by 2 combined standard errors by chance.
    noise = 2 * (mine["reward_final_se"] ** 2 + theirs["reward_final_se"] ** 2) ** 0.5
    gap = mine["reward_final"] - theirs["reward_final"]
    reward_ok = gap >= -(noise + args.reward_tolerance)
    return {
        "reward_final_gap": gap,
        "reward_noise_band": noise,
        "throughput_ratio": throughput,
        "iteration_time_ratio": mine["iteration_time_median_s"] / theirs["iteration_time_median_s"],
        "time_to_threshold_ratio": ratio(
            mine["time_to_threshold_s"], theirs["time_to_threshold_s"]
        ),
        "reward_no_worse": reward_ok,
        "incomplete": "incomplete" in mine or "incomplete" in theirs,
        "goal_met": throughput >= GOAL_THROUGHPUT_RATIO and reward_ok,
    }


def _fmt(value: float | None, spec: str, unit: str = "") -> str:
    return "never" if value is None else f"{format(value, spec)}{unit}"


def system_line(name: str, summary: dict) -> str:
    if "error" in summary:
        return f"  {name:<7} ERROR: {summary['error']}"
    line = (
        f"  {name:<7} {summary['iteration_time_median_s']:>9.3f}s "
        f"{summary['tps_machine']:>10.0f} {summary['tps_eq5']:>9.0f} ({summary['n_devices']} dev) "
        f"{summary['reward_first']:>7.3f} -> {summary['reward_final']:<6.3f} "
        f"{_fmt(summary['time_to_threshold_s'], '.1f', 's'):>8} setup {summary['setup_s']:.1f}s"
    )
    if "incomplete" in summary:
        line += (
            f"\n          INCOMPLETE ({summary['timed_iterations']} timed): {summary['incomplete']}"
        )
    return line


def print_model_report(model: str, report: dict, args: Any) -> None:
    """The model's settings, one line per system, the ratios and the goal verdict."""
    s = report["settings"]
    print(
        f"\n== {model}: {s['task']} ({', '.join(s['verifiers'])}), G={s['G']} N={s['N']}, "
        f"prompt<={s['max_prompt_length']} response<={s['max_response_length']}, lr {s['lr']:g}, "
        f"seed {s['seed']}, {s['iterations']} iterations ({args.warmup} warm-up)"
    )
    print(
        f"  {'system':<7} {'iter(med)':>10} {'TPS/machine':>10} {'TPS Eq.5':>9} "
        f"{'reward first -> final':>22} t(r>={s['threshold']:g})"
    )
    for name, summary in report["systems"].items():
        print(system_line(name, summary))
    print_comparison(report)


def print_comparison(report: dict) -> None:
    c = report["comparison"]
    if not c:
        return
    print_entropy_check(report["systems"])
    verdict = "MET" if c["goal_met"] else "NOT MET"
    print(
        f"  mindrl/TRL: throughput {c['throughput_ratio']:.2f}x, time per iteration "
        f"{c['iteration_time_ratio']:.2f}x, time to threshold "
        f"{_fmt(c['time_to_threshold_ratio'], '.2f', 'x')}; final reward gap "
        f"{c['reward_final_gap']:+.3f} (noise +-{c['reward_noise_band']:.3f}): "
        f"{'no worse' if c['reward_no_worse'] else 'WORSE'}"
    )
    if c["incomplete"]:
        verdict += " (from an incomplete run)"
    print(f"  goal (throughput >= {GOAL_THROUGHPUT_RATIO:.1f}x TRL, reward no worse): {verdict}")
    if c["throughput_ratio"] < GOAL_THROUGHPUT_RATIO:
        print_stage_breakdown(report["systems"]["mindrl"])


def print_entropy_check(systems: dict[str, dict]) -> None:
    """Same initial weights => the first iteration's policy entropy agrees up to sampling."""
    first = {
        name: s["curve"]["entropy"][0]
        for name, s in systems.items()
        if s.get("curve", {}).get("entropy") and s["curve"]["entropy"][0] is not None
    }
    if len(first) == len(systems):
        values = ", ".join(f"{name} {value:.3f}" for name, value in first.items())
        print(
            f"  entropy of the initial policy (same weights: equal up to sampling noise): {values}"
        )


def print_stage_breakdown(summary: dict) -> None:
    stages = summary["stage_median_s"]
    if not stages:
        print("  mindrl recorded no stage times")
        return
    total = summary["iteration_time_median_s"]
    parts = [f"{name} {seconds:.3f}s ({seconds / total:.0%})" for name, seconds in stages.items()]
    print(f"  where mindrl's iteration goes (median): {', '.join(parts)}")
    overhead = summary.get("overhead_median_s") or {}
    if overhead:
        spent = ", ".join(
            f"{key.removesuffix('_s')} {value:.3f}s" for key, value in overhead.items()
        )
        print(f"  of which not compute (median): {spent}")


def save_png(reports: dict[str, dict], path: Path) -> Path:
    """Reward against wall time of every system, one panel per model."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers; must precede pyplot
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(reports), figsize=(6 * len(reports), 4), squeeze=False)
    for axis, (model, report) in zip(axes[0], reports.items(), strict=True):
        for name, summary in report["systems"].items():
            if "curve" in summary:
                axis.plot(summary["curve"]["wall_s"], summary["curve"]["reward_mean"], marker=".",
                          label=name)  # fmt: skip
        axis.axhline(report["settings"]["threshold"], color="grey", linestyle="--", linewidth=1)
        axis.set_title(f"{model}: {report['settings']['task']}")
        axis.set_xlabel("wall time since first iteration (s)")
        axis.set_ylabel("reward (mean)")
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
