"""LoRA against full weights, in one process and one Ray session: what adapters save at a
real size, and whether they learn on a task the full-weight recipe learns.

Two measurements:

* ``smollm2``: ``configs/smollm2_135m.yaml`` (full weights) against
  ``configs/smollm2_135m_lora.yaml`` (rank 16), ``--iterations`` each (the first untimed),
  a checkpoint after the last. Per run, as ``{"full": {...}, "lora": {...}}``:
  ``trainable_params`` (the run's records), ``optimizer_state_bytes`` (the checkpoint's
  ``optim/`` tensors, from its index), ``checkpoint_bytes`` (the files of the last step's
  checkpoint), ``handover_bytes_per_iteration`` (the records' ``handover_bytes`` after the
  first iteration: what the generation engine was sent), ``peak_memory_bytes`` (the actor's
  peak: device memory on an accelerator, host RSS on a CPU) and ``iteration_s`` (median);
  then LoRA's share of each.
* ``tiny``: ``configs/tiny.yaml`` with full weights against ``actor.lora.rank=8``,
  ``--tiny-iterations`` each (200, the recipe's), ``reward_last10``: the mean reward of the
  last 10 iterations.

    python benchmarks/lora.py --json lora.json
    python benchmarks/lora.py --only tiny
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.harness.report import finish_report, machine  # noqa: E402  (after the path)

RECIPES = {
    "smollm2": {"full": ("smollm2_135m.yaml", []), "lora": ("smollm2_135m_lora.yaml", [])},
    "tiny": {"full": ("tiny.yaml", []), "lora": ("tiny.yaml", ["actor.lora.rank=8"])},
}
DTYPE_BYTES = {"F32": 4, "F64": 8, "BF16": 2, "F16": 2, "I64": 8, "I32": 4}
SHARES = (
    "trainable_params",
    "optimizer_state_bytes",
    "checkpoint_bytes",
    "handover_bytes_per_iteration",
    "peak_memory_bytes",
    "iteration_s",
)


def run_recipe(name: str, overrides: list[str], work: Path, device: str) -> list[dict]:
    """Train one recipe; its records."""
    from mindrl.config import load_config
    from mindrl.metrics import read_metrics
    from trainers.driver.train import train
    from trainers.registry import get_algorithm

    grpo = get_algorithm("grpo")
    overrides = [*overrides, f"logging.dir={work}", "logging.backends=[]"]
    config = load_config(ROOT / "configs" / name, overrides, grpo)
    if train(config, "grpo", device=device) != 0:
        raise RuntimeError(f"the {name} run {overrides} failed; see its output above")
    return read_metrics(work / "metrics.jsonl")


def last_checkpoint(work: Path) -> Path:
    steps = sorted((work / "checkpoints" / "actor").glob("step_*"))
    if not steps:
        raise RuntimeError(f"no checkpoint was written under {work}")
    return steps[-1]


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def _index(step: Path) -> dict:
    return json.loads((step / "shards" / "index.json").read_text())


def optimizer_state_bytes(step: Path) -> int:
    """The ``optim/`` tensors a checkpoint holds, read from its index (no tensor loaded)."""
    return sum(
        math.prod(entry["shape"]) * DTYPE_BYTES[entry["dtype"]]
        for name, entry in _index(step).items()
        if name.startswith("optim/")
    )


def trainable_params(records: list[dict], step: Path) -> int:
    """A LoRA run records what it trains; a full-weight run trains every weight its
    checkpoint holds (``model/``)."""
    if "trainable_params" in records[-1]:
        return int(records[-1]["trainable_params"])
    return sum(
        math.prod(entry["shape"])
        for name, entry in _index(step).items()
        if name.startswith("model/")
    )


def peak_memory_bytes(records: list[dict], device: str) -> int:
    key = "host_peak_mib" if device == "cpu" else "device_peak_mib"
    return int(max(r["memory"]["actor"][key] for r in records) * 2**20)


def measure_smollm2(iterations: int, work: Path, device: str) -> dict[str, Any]:
    runs = {}
    for kind, (name, overrides) in RECIPES["smollm2"].items():
        print(f"lora: {name}, {iterations} iterations ...", flush=True)
        folder = work / f"smollm2-{kind}"
        steps = [f"iterations={iterations}", f"checkpoint.every={iterations}"]
        records = run_recipe(name, [*overrides, *steps], folder, device)
        step = last_checkpoint(folder)
        timed = records[1:]
        runs[kind] = {
            "trainable_params": trainable_params(records, step),
            "optimizer_state_bytes": optimizer_state_bytes(step),
            "checkpoint_bytes": folder_bytes(step),
            "handover_bytes_per_iteration": int(
                statistics.median(r["handover_bytes"] for r in timed)
            ),
            "handover_bytes_first": int(records[0]["handover_bytes"]),
            "peak_memory_bytes": peak_memory_bytes(records, device),
            "iteration_s": statistics.median(r["iteration_time_s"] for r in timed),
            "reward_mean": statistics.fmean(r["reward_mean"] for r in records),
        }
    runs["lora_over_full"] = {
        key: runs["lora"][key] / runs["full"][key] for key in SHARES if runs["full"][key]
    }
    return runs


def measure_tiny(iterations: int, work: Path, device: str) -> dict[str, Any]:
    runs = {}
    for kind, (name, overrides) in RECIPES["tiny"].items():
        print(f"lora: tiny {kind}, {iterations} iterations ...", flush=True)
        steps = [f"iterations={iterations}", "checkpoint.every=0", "logging.progress_bar=false"]
        records = run_recipe(name, [*overrides, *steps], work / f"tiny-{kind}", device)
        runs[kind] = {
            "reward_last10": statistics.fmean(r["reward_mean"] for r in records[-10:]),
            "trainable_params": int(records[-1].get("trainable_params", 0)) or None,
            "iteration_s": statistics.median(r["iteration_time_s"] for r in records[1:]),
        }
    return runs


def print_report(report: dict[str, Any]) -> None:
    print(f"\nmeasured on {report['machine']}")
    if "smollm2" in report:
        runs = report["smollm2"]
        print("  SmolLM2-135M, full weights against rank-16 LoRA:")
        print(f"  {'':<30} {'full':>14} {'lora':>14} {'lora / full':>12}")
        for key in SHARES:
            full, lora = runs["full"][key], runs["lora"][key]
            share = runs["lora_over_full"].get(key, float("nan"))
            print(f"  {key:<30} {full:>14,.2f} {lora:>14,.2f} {share:>11.1%}")
        print(
            f"  handed over at the first iteration: full {runs['full']['handover_bytes_first']:,}"
            f" B, lora {runs['lora']['handover_bytes_first']:,} B"
        )
    if "tiny" in report:
        runs = report["tiny"]
        print("  tiny recipe, full weights against actor.lora.rank=8:")
        for kind, row in runs.items():
            print(
                f"  {kind:<5} reward_last10 {row['reward_last10']:.3f}  trainable "
                f"{row['trainable_params'] or 'all'}  iteration {row['iteration_s']:.2f} s"
            )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lora", description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=tuple(RECIPES), default=None)
    parser.add_argument("--iterations", type=int, default=6, help="smollm2: per run")
    parser.add_argument("--tiny-iterations", type=int, default=200, help="tiny: per run")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or npu")
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.iterations < 2 or args.tiny_iterations < 10:
        print("lora: error: --iterations >= 2 and --tiny-iterations >= 10", file=sys.stderr)
        return 2
    import ray

    from mindrl.config import load_config
    from mindrl.run_plan import build_run_plan
    from trainers.driver.setup import _connect_ray
    from trainers.registry import get_algorithm

    report: dict[str, Any] = {"machine": machine(f"device {args.device}")}
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="mindrl-lora-"))
    grpo = get_algorithm("grpo")
    config = load_config(ROOT / "configs" / "smollm2_135m.yaml", [], grpo)
    _connect_ray(config, args.device, build_run_plan(grpo, config))
    try:
        if args.only in (None, "smollm2"):
            report["smollm2"] = measure_smollm2(args.iterations, work, args.device)
        if args.only in (None, "tiny"):
            report["tiny"] = measure_tiny(args.tiny_iterations, work, args.device)
    except RuntimeError as error:
        print(f"lora: error: {error}", file=sys.stderr)
        return 1
    finally:
        ray.shutdown()
    return finish_report(report, print_report, args.json)


if __name__ == "__main__":
    sys.exit(main())
