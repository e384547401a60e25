"""Planned vs measured device memory of the actor's stages, measured on the CPU.

Each shape runs one actor rank's real engines (Megatron training engine, resharder,
transformers generation engine) for a few iterations inside a tensor-level live-bytes
tracker (``benchmarks/harness/stage_memory.py`` says what it counts and what it treats
as host memory, as an accelerator would), and prints, per stage and per rollout step,
the planner's bytes (``mindrl/planner``) beside the measured peak. The stage rows are
what a GPU run's end-of-run line compares (``update``, ``rollout``); the steps say which
term is off when a stage is. Every ``--shape`` is a config and overrides, so the model
is checked on shapes it was not written for:

    python benchmarks/stage_memory.py                      # every shape
    python benchmarks/stage_memory.py --shape tiny --shape gqa-bf16 --json out.json
    python benchmarks/stage_memory.py --config configs/tiny.yaml model.num_layers=4

Exit status 1 when a stage is off by more than ``--tolerance`` (default 15 %).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness.spawn import run_ranks
from benchmarks.harness.stage_memory import measure_actor_stages, stage_peaks
from mindrl.config import load_config
from mindrl.config.layout import training_devices
from mindrl.planner.memory import plan_memory
from mindrl.planner.report import planned_roles
from mindrl.run_plan import build_run_plan
from trainers.registry import get_algorithm

MIB = 2**20
TINY = "configs/tiny.yaml"
ONE_DEVICE = [
    "resources.devices_per_node=1",
    *(f"{role}.parallel.tp=1" for role in ("actor", "reference", "critic")),
]
#: The first GPU run's 0.18B llama (tiny.yaml at 12 layers, hidden 1024, bf16) with 4 of
#: its layers and a quarter of its batch, so two CPU iterations take seconds.
SMALL_018B = [
    *ONE_DEVICE,
    "model.dtype=bfloat16",
    "model.hidden_size=1024",
    "model.num_attention_heads=16",
    "model.num_kv_heads=4",
    "model.ffn_hidden_size=4096",
    "model.num_layers=4",
    "data.global_batch_size=16",
]
SHAPES: dict[str, tuple[str, list[str]]] = {
    "tiny": (TINY, ONE_DEVICE),
    "tiny-tp2": (TINY, []),  # the recipe: TP 2 with sequence parallelism, 2 ranks
    "0.18b-4-layers": (TINY, SMALL_018B),
    "gqa-bf16-long": (
        TINY,
        [
            *ONE_DEVICE,
            "model.dtype=bfloat16",
            "model.hidden_size=256",
            "model.num_attention_heads=8",
            "model.num_kv_heads=2",
            "model.head_dim=32",
            "model.ffn_hidden_size=704",
            "model.max_position_embeddings=512",
            "rollout.max_prompt_length=96",
            "rollout.max_response_length=32",
            "data.global_batch_size=8",
            "actor.micro_batch_size=16",
        ],
    ),
    "vocab-8k": (
        TINY,
        [
            *ONE_DEVICE,
            "model.vocab_size=8192",
            "model.num_layers=3",
            "rollout.max_response_length=24",
            "rollout.max_prompt_length=24",
            "model.max_position_embeddings=64",
            "data.global_batch_size=8",
            "data.n_samples_per_prompt=4",
            "actor.micro_batch_size=8",
        ],
    ),
    "distributed-optimizer-no-swap": (
        TINY,
        [
            *ONE_DEVICE,
            "actor.optim.distributed_optimizer=true",
            "rollout.swap=false",
            "model.num_layers=3",
        ],
    ),
    "recompute-no-shared-prompts": (
        TINY,
        [
            *ONE_DEVICE,
            "actor.activation_checkpointing=true",
            "actor.share_prompts=false",
            "model.hidden_size=256",
        ],
    ),
}


def planned(config_path: str, overrides: list[str], trainer: str) -> dict[str, int]:
    """The planner's actor bytes per stage and rollout step (device bytes of a 80 GiB
    device: only the memory fraction's share depends on it, and every shape here sets
    ``rollout.kv_cache_mib``)."""
    algorithm = get_algorithm(trainer)
    config = load_config(config_path, overrides, algorithm)
    plan = build_run_plan(algorithm, config)
    memory = plan_memory(config, 80 * 2**30, planned_roles(plan), plan.generates)
    steps = memory.rollout
    return {
        "rollout": steps.peak,
        "rollout:reshard": steps.reshard,
        "rollout:load": steps.load,
        "rollout:generate": steps.generate,
        "rollout:swap_in": steps.swap_in,
        "update": memory.update_stage,
    }


def measure(config_path: str, overrides: list[str], trainer: str, iterations: int) -> dict:
    """Every rank's measured peaks (the largest over ranks per window name)."""
    config = load_config(config_path, overrides, get_algorithm(trainer))
    world = training_devices(config)
    ranks = run_ranks(
        measure_actor_stages,
        world,
        config_path,
        overrides,
        trainer,
        iterations,
        device="cpu",
        threads=1,
        timeout_s=1800,
    )
    peaks: dict[str, int] = {}
    for rank in ranks:
        for name, value in stage_peaks(rank["windows"]).items():
            peaks[name] = max(peaks.get(name, 0), value)
    ledger = [check for rank in ranks for check in rank["ledger"] if check]
    return {"world": world, "peaks": peaks, "ledger": ledger}


def compare(name: str, config_path: str, overrides: list[str], args) -> dict:
    plan = planned(config_path, overrides, args.trainer)
    measured = measure(config_path, overrides, args.trainer, args.iterations)
    rows = []
    for stage, planned_bytes in plan.items():
        got = measured["peaks"].get(stage)
        if got is None or planned_bytes == 0:  # a step this configuration has not
            continue
        rows.append(
            {
                "stage": stage,
                "planned_mib": round(planned_bytes / MIB, 3),
                "measured_mib": round(got / MIB, 3),
                "ratio": round(got / planned_bytes, 3) if planned_bytes else None,
            }
        )
    return {"shape": name, "world": measured["world"], "rows": rows, "ledger": measured["ledger"]}


def print_result(result: dict, tolerance: float) -> bool:
    print(f"\n{result['shape']} ({result['world']} rank(s)): MiB, measured / planned")
    ok = True
    for row in result["rows"]:
        stage_row = ":" not in row["stage"]
        off = row["ratio"] is None or abs(row["ratio"] - 1) > tolerance
        ok &= not (stage_row and off)
        mark = "  <- off" if stage_row and off else ""
        print(
            f"  {row['stage']:<18} planned {row['planned_mib']:>10.3f}  measured "
            f"{row['measured_mib']:>10.3f}  {row['ratio']:.2f}x{mark}"
        )
    agree = all(c["ledger"] == c["tracker"] for c in result["ledger"])
    print(f"  CPU ledger vs tracker on the ledger's tensors: {'equal' if agree else 'DIFFER'}")
    return ok and agree


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", action="append", choices=sorted(SHAPES), default=None)
    parser.add_argument("--config", help="measure this config (with the overrides) instead")
    parser.add_argument("overrides", nargs="*", help="key=value overrides for --config")
    parser.add_argument("--trainer", default="grpo")
    parser.add_argument("--iterations", type=int, default=2, help="the first one warms up")
    parser.add_argument("--tolerance", type=float, default=0.15)
    parser.add_argument("--json", type=Path, help="write the results here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.config:
        cases = {Path(args.config).stem: (args.config, args.overrides)}
    else:
        cases = {name: SHAPES[name] for name in (args.shape or SHAPES)}
    results, ok = [], True
    for name, (config_path, overrides) in cases.items():
        result = compare(name, config_path, overrides, args)
        ok &= print_result(result, args.tolerance)
        results.append(result)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
