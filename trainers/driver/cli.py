"""``mindrl-train``: the one command that plans or runs an RL post-training job, with any
algorithm in trainers/registry.py.

It lives in ``trainers`` (the top layer) because it picks an algorithm by name; the
config, planner and pipeline it drives live in ``mindrl``.

Exit codes: 0 done, 1 the run failed, 2 bad input (config, override, device, file),
3 the plan does not fit in device memory, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from backends.device import DeviceUnavailableError, library_workspace_bytes
from backends.device.registry import DEVICE_CLASSES, resolve_device
from mindrl.algorithm import Algorithm
from mindrl.config import ConfigError, MindRLConfig, load_config
from mindrl.metrics.sinks import missing_sink_packages
from mindrl.planner.capacity import CapacityError, device_bytes, host_bytes
from mindrl.planner.offload import plan_offload
from mindrl.planner.report import build_plan
from mindrl.rewards.routing import reward_problems
from mindrl.run_plan import build_run_plan
from trainers.registry import ALGORITHMS, get_algorithm

TRAINERS = tuple(ALGORITHMS)
CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "tiny.yaml"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="mindrl-train",
        description=f"RL post-training ({', '.join(TRAINERS)}) on NPU, GPU or CPU.",
        epilog="Overrides: dotted.key=value, e.g. actor.optim.lr=1e-6 (or --set KEY=VALUE). "
        "--help-config lists every config key.",
    )
    parser.add_argument("--trainer", required=True, choices=TRAINERS, help="RL algorithm.")
    parser.add_argument(
        "--config",
        type=Path,
        default=DEFAULT_CONFIG,
        help=f"YAML recipe (default: the CPU embedded default {DEFAULT_CONFIG.name}).",
    )
    parser.add_argument(
        "--device",
        choices=["auto", *DEVICE_CLASSES],
        help="Device platform (overrides config 'device' and $MINDRL_DEVICE).",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="Print the plan (layouts, memory, sample flow) and exit; no accelerator needed.",
    )
    parser.add_argument(
        "--json", action="store_true", help="With --dry-run: print the plan as JSON."
    )
    parser.add_argument(
        "--resume", action="store_true", help="Continue from the latest checkpoint."
    )
    parser.add_argument(
        "--resume-from",
        metavar="PATH",
        help="Continue from this checkpoint: a step folder (checkpoints/actor/step_00000012) "
        "or a checkpoints folder (its latest).",
    )
    parser.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Override one config value (repeatable).",
    )
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="Config overrides.")
    return parser.parse_args(argv)


def dry_run(
    config: MindRLConfig, algorithm: Algorithm, requested_device: str | None, as_json: bool
) -> int:
    device_name = (
        requested_device if requested_device not in (None, "auto") else resolve_device(None)
    )
    problems = [] if algorithm.offline else reward_problems(config)
    if problems:  # what a run would refuse at start-up, the plan refuses too
        for problem in problems:
            print(f"mindrl-train: config error: {problem}", file=sys.stderr)
        return 2
    per_device, per_node = device_bytes(config, device_name), host_bytes(config)
    workspace = library_workspace_bytes(device_name)
    run_plan = plan_offload(
        config, build_run_plan(algorithm, config), per_device, per_node, workspace
    )
    plan = build_plan(config, run_plan, device_name, per_device, per_node)
    if as_json:
        print(json.dumps(plan, indent=2))
    else:
        from mindrl.planner.render import render_plan

        render_plan(plan)
    return 3 if plan["fit_problems"] else 0


def run(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    algorithm = get_algorithm(args.trainer)
    config = load_config(args.config, [*args.sets, *args.overrides], algorithm=algorithm)
    requested = args.device or (None if config.device == "auto" else config.device)
    if args.dry_run:
        return dry_run(config, algorithm, requested, args.json)
    resolve_device(requested)  # fail fast, before any process starts
    if missing := missing_sink_packages(config.logging.backends):
        raise ConfigError(missing)
    print("start-up: loading torch, Ray and Megatron-core", file=sys.stderr)
    from trainers.driver.train import train  # Ray, torch, Megatron: only when training

    resume = args.resume_from or args.resume
    return train(config, args.trainer, device=requested, resume=resume, command=argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--help-config" in argv:
        from mindrl.config.reference import render_reference

        print(render_reference())
        return 0
    args = parse_args(argv)
    try:
        return run(args, argv)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"mindrl-train: config error: {problem}", file=sys.stderr)
        return 2
    except (CapacityError, DeviceUnavailableError) as exc:
        print(f"mindrl-train: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mindrl-train: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
