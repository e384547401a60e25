"""Checkpoint save and load per rank: seconds, and host memory above what the rank holds.

Spawns ``--world`` ranks (gloo on the CPU), builds a model (SmolLM2-135M's shape with
random weights, or the tiny one) at ``--tp`` / ``--pp`` (DP is the rest), takes one
optimizer step so the Adam moments exist, then per rank measures a synchronous save, a
background save (until it returns, then until it is published) and a load into the
same engine, each as wall time and the peak resident size (VmHWM) above the resident
size before it, after freed heap is handed back (``malloc_trim``). Beside them: the
rank's own state (its weights and optimizer state) and the bytes it wrote. A sharded
save writes from views of the live tensors (extra memory: one tensor's worth while it is
written), a background save first copies the rank's part to host memory, and a load
reads boxes into the live tensors; none holds a full model.

    python benchmarks/checkpoint.py --model smollm2-135m --world 2
    python benchmarks/checkpoint.py --model smollm2-135m --world 2 --tp 2 --distributed-optimizer

``--recipe CONFIG`` measures instead what periodic checkpoints cost a run: the recipe
trains ``--iterations`` three times, without periodic checkpoints, saving every
``--every`` iterations synchronously, and in the background (``checkpoint.async``); per
run the wall time of its iterations plus the time the driver waited on the periodic
saves, and per save what it added over the run without them.

    python benchmarks/checkpoint.py --recipe configs/smollm2_135m.yaml --iterations 12 --every 2
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.train_step import TINY, smollm2_spec

MODELS = {"tiny": lambda: TINY, "smollm2-135m": smollm2_spec}
MIB = 2**20


def _window(action) -> tuple[float, float]:
    """``action()``'s seconds and the peak resident MiB above the resident size before it."""
    from backends.device.host_memory import (
        peak_resident_bytes,
        release_free_heap,
        reset_peak_resident,
        resident_bytes,
    )

    release_free_heap()
    before = resident_bytes()
    reset_peak_resident()
    start = time.perf_counter()
    action()
    seconds = time.perf_counter() - start
    return seconds, (peak_resident_bytes() - before) / MIB


def measure(rank: int, world: int, spec, layout: dict, distributed: bool, root: str) -> dict:
    import torch

    from backends.megatron import MegatronEngine, OptimSpec, ParallelSpec, ResponseBatch
    from backends.megatron.builder import destroy_parallel

    optim = OptimSpec(lr=1e-5, distributed_optimizer=distributed)
    engine = MegatronEngine(spec, ParallelSpec(**layout), optim)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, spec.vocab_size, (2, 16), generator=gen)
    batch = ResponseBatch.continuation(ids, start=1)
    engine.train_step(batch, lambda out, micro, counts: -out["logprobs"], 1)
    engine.release_gradients()
    state = sum(t.numel() * t.element_size() for t in engine.model.parameters())
    state += sum(t.numel() * t.element_size() for t in engine.optimizer_state_tensors())

    results = {"own_state_mib": state / MIB}
    results["save_s"], results["save_extra_mib"] = _window(
        lambda: engine.save_checkpoint(f"{root}/sync", {"step": 1})
    )
    results["background_return_s"], results["background_extra_mib"] = _window(
        lambda: engine.save_checkpoint(f"{root}/background", {"step": 1}, background=True)
    )
    start = time.perf_counter()
    engine.finish_checkpoint()
    results["background_written_s"] = results["background_return_s"] + time.perf_counter() - start
    results["load_s"], results["load_extra_mib"] = _window(
        lambda: engine.load_checkpoint(f"{root}/sync")
    )
    shard = Path(root) / "sync" / "step_00000001" / "shards" / f"rank_{rank:05d}.safetensors"
    results["written_mib"] = shard.stat().st_size / MIB if shard.exists() else 0.0
    destroy_parallel()
    return results


def recipe_run(recipe: str, iterations: int, every: int, mode: str, out: Path) -> dict:
    """One run of ``recipe``: its iterations' seconds and each periodic save's blocking time."""
    from mindrl.config import load_config
    from mindrl.metrics import read_metrics
    from trainers.driver import train as driver
    from trainers.registry import get_algorithm

    overrides = [
        f"iterations={iterations}",
        f"checkpoint.every={0 if mode == 'none' else every}",
        f"checkpoint.async={str(mode == 'async').lower()}",
        f"logging.dir={out / mode}",
    ]
    config = load_config(recipe, overrides, algorithm=get_algorithm("grpo"))
    waits: list[float] = []
    save = driver.save_checkpoint

    def timed_save(*args, **kwargs):  # instrumentation: the real save, timed
        start = time.perf_counter()
        save(*args, **kwargs)
        waits.append(time.perf_counter() - start)

    driver.save_checkpoint = timed_save
    try:
        if driver.train(config, "grpo") != 0:
            raise SystemExit(f"the {mode} run failed")
    finally:
        driver.save_checkpoint = save
    seconds = [r["iteration_time_s"] for r in read_metrics(out / mode / "metrics.jsonl")]
    periodic = waits[:-1]  # the last wait is the end-of-run save, the same in every mode
    return {"iterations_s": sum(seconds), "saves": len(periodic), "waited_s": sum(periodic)}


def recipe_cost(recipe: str, iterations: int, every: int) -> dict:
    with tempfile.TemporaryDirectory() as out:
        runs = {m: recipe_run(recipe, iterations, every, m, Path(out)) for m in MODES}
    base = runs["none"]["iterations_s"]
    for run in runs.values():
        run["total_s"] = run["iterations_s"] + run["waited_s"]
        run["per_save_s"] = (run["total_s"] - base) / run["saves"] if run["saves"] else 0.0
    return runs


MODES = ("none", "sync", "async")


def main(argv: list[str] | None = None) -> int:
    from benchmarks.harness.spawn import run_ranks

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="smollm2-135m")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--distributed-optimizer", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--recipe", help="measure periodic saves in this recipe's runs")
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--every", type=int, default=2)
    args = parser.parse_args(argv)
    if args.recipe:
        runs = recipe_cost(args.recipe, args.iterations, args.every)
        if args.json:
            print(json.dumps(runs, indent=1))
            return 0
        for mode, run in runs.items():
            print(
                f"{mode:>5}: {run['saves']} periodic saves, iterations {run['iterations_s']:.1f} s "
                f"+ waiting on saves {run['waited_s']:.1f} s = {run['total_s']:.1f} s; "
                f"{run['per_save_s']:+.2f} s per save"
            )
        return 0
    spec = MODELS[args.model]()
    layout = {"tp": args.tp, "pp": args.pp}
    with tempfile.TemporaryDirectory() as root:
        ranks = run_ranks(
            measure, args.world, spec, layout, args.distributed_optimizer, root,
            device="cpu", threads=1, timeout_s=3600,
        )  # fmt: skip
    report = {
        "model": args.model,
        "layout": {**layout, "world": args.world},
        "distributed_optimizer": args.distributed_optimizer,
        "ranks": [{k: round(v, 2) for k, v in rank.items()} for rank in ranks],
    }
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"{args.model} at {report['layout']}, distributed optimizer {args.distributed_optimizer}")
    for rank, row in enumerate(report["ranks"]):
        print(
            f"rank {rank}: holds {row['own_state_mib']:.0f} MiB, writes {row['written_mib']:.0f}; "
            f"save {row['save_s']:.2f} s +{row['save_extra_mib']:.0f} MiB; background returns "
            f"in {row['background_return_s']:.2f} s +{row['background_extra_mib']:.0f} MiB, "
            f"written in {row['background_written_s']:.2f} s; load {row['load_s']:.2f} s "
            f"+{row['load_extra_mib']:.0f} MiB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
