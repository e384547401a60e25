"""Resharding memory: naive vs allgather–swap, analytic (from a config) or measured.

    # per-device bytes of both stages and the redundant bytes (mindrl/planner/memory.py)
    .venv/bin/python benchmarks/reshard.py --analytic --config configs/qwen25_32b.yaml

    # spawn the ranks, run naive and allgather–swap on a synthetic model, same run
    .venv/bin/python benchmarks/reshard.py --measure --world 4 --train-tp 2 --gen-tp 1

    # one process plays rank 0 of an 8-rank world (peers' shards simulated locally)
    .venv/bin/python benchmarks/reshard.py --measure --world 1 --layout-world 8 \
        --train-tp 4 --gen-tp 2 --hidden 4096 --layers 8

Memory is read through the device layer: the allocator on GPUs/NPUs, the ledger of
tracked tensors on the CPU. ``--json PATH`` writes the report, ``--png PATH`` plots
the memory timeline of both resharders.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends.device import get_device
from benchmarks.harness.reshard_measure import MeasureSpec, measure_rank
from benchmarks.harness.spawn import run_ranks
from mindrl.config import ModelConfig, ParallelConfig, load_config
from mindrl.planner.memory import plan_memory, redundant_bytes
from mindrl.reshard.layouts import GenLayout, TrainLayout

GB, MIB = 1e9, 2**20
DEFAULT_DEVICE_GIB = 64


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--analytic", action="store_true", help="memory model of a config")
    mode.add_argument("--measure", action="store_true", help="spawn ranks and measure")
    parser.add_argument("--config", help="YAML recipe for --analytic")
    parser.add_argument("--world", type=int, default=2, help="processes to spawn")
    parser.add_argument("--layout-world", type=int, help="ranks of the layouts (default --world)")
    parser.add_argument("--sim-rank", type=int, default=0, help="rank played when --world 1")
    for name, default in (("train-tp", 2), ("train-pp", 1), ("train-ep", 1), ("train-etp", 1)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--gen-tp", type=int, default=1)
    parser.add_argument("--gen-ep", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--ffn", type=int, default=1536)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--experts", type=int, default=0)
    parser.add_argument("--expert-ffn", type=int, default=None)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--bucket-mib", type=float, default=16.0, help="all-gather buffer cap")
    parser.add_argument("--device", default=None, help="device-layer name (default: detect)")
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON")
    parser.add_argument("--png", metavar="PATH", help="plot the memory timeline")
    args = parser.parse_args(argv)
    if args.analytic and not args.config:
        parser.error("--analytic needs --config configs/X.yaml")
    return args


# ---- analytic --------------------------------------------------------------------------
def analytic_report(config_path: str) -> dict:
    config = load_config(config_path)
    gib = config.resources.device_memory_gib or DEFAULT_DEVICE_GIB
    plan = plan_memory(config, int(gib * 2**30))
    train, rollout = config.actor.parallel, config.rollout
    return {
        "mode": "analytic",
        "config": config_path,
        "world": config.world_size,
        "train_layout": {"tp": train.tp, "pp": train.pp, "ep": train.ep, "etp": train.etp},
        "gen_layout": {"tp": rollout.tp, "ep": rollout.ep, "dp": config.world_size // rollout.tp},
        "device_gib": gib,
        "memory": plan.as_dict(),
    }


def print_analytic(report: dict) -> None:
    memory = report["memory"]
    training = memory["training"]
    print(
        f"{report['config']}: world {report['world']}, train {report['train_layout']}, "
        f"generation {report['gen_layout']}, device {report['device_gib']} GiB"
    )
    print(
        f"  training stage: weights {training['weights'] / GB:.2f} GB, grads "
        f"{training['grads'] / GB:.2f} GB, optimizer {training['optimizer'] / GB:.2f} GB, "
        f"activations {training['activations'] / GB:.2f} GB"
    )
    for mode in ("naive", "swap"):
        gen = memory[f"generation_{mode}"]
        print(
            f"  generation ({mode:5s}): shard {gen['shard'] / GB:.2f} GB + resident training "
            f"{gen['resident_training'] / GB:.2f} GB; "
            f"KV budget {gen['kv_cache_budget'] / GB:.2f} GB"
        )
    print(
        f"  redundant training weight bytes with naive resharding (Eq. 3): "
        f"{memory['redundant_bytes'] / GB:.2f} GB per device; with allgather–swap: 0"
    )
    print(f"  swapped to host per device: {memory['swap_bytes'] / GB:.2f} GB")


# ---- measured --------------------------------------------------------------------------
def measure_spec(args: argparse.Namespace) -> MeasureSpec:
    model = ModelConfig(
        num_layers=args.layers,
        hidden_size=args.hidden,
        num_attention_heads=args.heads,
        num_kv_heads=args.kv_heads,
        ffn_hidden_size=args.ffn,
        vocab_size=args.vocab,
        num_experts=args.experts,
        moe_ffn_hidden_size=args.expert_ffn,
        dtype=args.dtype,
    )
    world = args.layout_world or args.world
    train = TrainLayout(
        world, tp=args.train_tp, pp=args.train_pp, ep=args.train_ep, etp=args.train_etp
    )
    gen = GenLayout(world, tp=args.gen_tp, ep=args.gen_ep)
    simulate = args.sim_rank if args.world == 1 and world > 1 else None
    return MeasureSpec(model, train, gen, int(args.bucket_mib * MIB), simulate)


def measure_report(args: argparse.Namespace) -> dict:
    spec = measure_spec(args)
    if args.world == 1:
        get_device(args.device)
        ranks = [measure_rank(0, 1, spec)]
    else:
        ranks = run_ranks(measure_rank, args.world, spec, device=args.device)
    train = spec.train
    parallel = ParallelConfig(tp=train.tp, pp=train.pp, ep=train.ep, etp=train.etp)
    analytic = redundant_bytes(spec.model, parallel, spec.gen.ep)
    return {
        "mode": "measure",
        "device": get_device(args.device).name,
        "train_layout": vars(args) | {"layout_world": train.world},
        "analytic_redundant_bytes": analytic,
        "ranks": ranks,
        "goals": goals(ranks, analytic, get_device(args.device).name),
    }


def goals(ranks: list[dict], analytic: int, device: str) -> dict:
    naive_redundant = max(r["naive"]["redundant_bytes"] for r in ranks)
    swap_redundant = max(r["allgather_swap"]["redundant_bytes"] for r in ranks)
    out_ratio = min(r["allgather_swap"]["swap_out_gbps"] / r["pinned_d2h_gbps"] for r in ranks)
    in_ratio = min(r["allgather_swap"]["swap_in_gbps"] / r["pinned_h2d_gbps"] for r in ranks)
    deviation = abs(naive_redundant - analytic) / max(analytic, 1)
    return {
        "swap_redundant_bytes": swap_redundant,
        "swap_redundant_is_zero": swap_redundant == 0,
        "naive_redundant_bytes": naive_redundant,
        "naive_redundant_bytes_min_rank": min(r["naive"]["redundant_bytes"] for r in ranks),
        "naive_vs_analytic_deviation": deviation,
        "naive_within_2pct": deviation <= 0.02,
        "swap_out_vs_pinned": out_ratio,
        "swap_in_vs_pinned": in_ratio,
        "bandwidth_goal_applies": device != "cpu",
        "bandwidth_at_least_80pct": min(out_ratio, in_ratio) >= 0.8,
    }


def print_measure(report: dict) -> None:
    for r in report["ranks"]:
        print(f"rank {r['rank']}:")
        for mode in ("naive", "allgather_swap"):
            m = r[mode]
            steps = ", ".join(f"{s} {b / MIB:.2f}" for s, b in m["timeline"])
            print(f"  {mode:14s} timeline (MiB): {steps}")
            print(
                f"  {mode:14s} generation stage {m['generation_stage_bytes'] / MIB:.2f} MiB "
                f"(shards {m['generation_shard_bytes'] / MIB:.2f}, redundant "
                f"{m['redundant_bytes'] / MIB:.2f}), reshard peak "
                f"{m['reshard_peak_bytes'] / MIB:.2f} MiB, "
                f"reshard {m['reshard_seconds'] * 1e3:.1f} ms"
            )
        s = r["allgather_swap"]
        print(
            f"  swap {s['swapped_bytes'] / MIB:.2f} MiB: out {s['swap_out_gbps']:.2f} GB/s, in "
            f"{s['swap_in_gbps']:.2f} GB/s; pinned copy d2h {r['pinned_d2h_gbps']:.2f} GB/s, "
            f"h2d {r['pinned_h2d_gbps']:.2f} GB/s"
        )
    g = report["goals"]
    print("goals:")
    print(
        f"  redundant training bytes in generation with allgather–swap = 0: "
        f"{g['swap_redundant_bytes']} -> {'MET' if g['swap_redundant_is_zero'] else 'MISSED'}"
    )
    print(
        f"  naive redundancy {g['naive_redundant_bytes'] / MIB:.3f} MiB (busiest rank; least "
        f"{g['naive_redundant_bytes_min_rank'] / MIB:.3f} MiB) vs analytic (Eq. 3, "
        f"mindrl.planner.memory) {report['analytic_redundant_bytes'] / MIB:.3f} MiB: "
        f"{g['naive_vs_analytic_deviation'] * 100:.2f}% -> "
        f"{'MET' if g['naive_within_2pct'] else 'MISSED'} (goal <= 2%)"
    )
    verdict = "MET" if g["bandwidth_at_least_80pct"] else "MISSED"
    if not g["bandwidth_goal_applies"]:
        verdict = "n/a on CPU (no host/device link)"
    print(
        f"  swap bandwidth vs pinned copy: out {g['swap_out_vs_pinned'] * 100:.0f}%, in "
        f"{g['swap_in_vs_pinned'] * 100:.0f}% -> {verdict} (goal >= 80% on a GPU)"
    )


def plot_timeline(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(10, 4))
    for r in report["ranks"][:4]:
        for mode, style in (("naive", "--"), ("allgather_swap", "-")):
            steps = r[mode]["timeline"]
            axes.plot(
                [b / MIB for _, b in steps], style, marker=".", label=f"rank {r['rank']} {mode}"
            )
    axes.set_xlabel("resharding step (start, allgather/copy/free per bucket, swap out)")
    axes.set_ylabel("device memory (MiB)")
    axes.set_title(f"Resharding memory timeline ({report['device']})")
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.analytic:
        report = analytic_report(args.config)
        print_analytic(report)
    else:
        report = measure_report(args)
        print_measure(report)
        if args.png:
            plot_timeline(report, args.png)
            print(f"timeline plot: {args.png}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
        print(f"report: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
