"""Every accelerator check in one run, summed up in one JSON file.

Run it through ``scripts/accelerator_checks.sh``. On a machine with a GPU or NPU it runs
the tests marked ``cuda`` / ``npu`` / ``multi_device`` and the accelerator benchmarks:
the training step's MFU on a ~1B dense model (``benchmarks/train_step.py``), the swap
bandwidth against a pinned copy (``benchmarks/reshard.py --measure``), the generation
engines' weight hand-over (``benchmarks/rollout.py``) and, where Ray is installed, a
short GRPO run on the accelerator. A check whose Python packages are missing is skipped
with their names; nothing is installed. Without an accelerator every check is skipped
and the exit status is 0. Exit status 1: a check failed; 2: torch does not import.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MARKERS = "cuda or npu or multi_device"
#: A test module holds accelerator tests when it uses one of these.
ACCELERATOR_TEST = re.compile(r"device_params\(|pytest\.mark\.(cuda|npu|multi_device)\b")
#: Dense bf16 peak TFLOPS of one device, by a piece of its product name (first match wins).
PEAK_TFLOPS = (
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),
    ("H200", 989.0),
    ("H800", 989.0),
    ("A100", 312.0),
    ("L40S", 362.0),
)
TAIL_CHARS = 3000
OWN_PACKAGES = frozenset({"mindrl", "backends", "trainers", "tests", "benchmarks"})


@dataclass
class Machine:
    """What this machine offers the checks."""

    device: str | None  # device-layer name of the accelerator, None without one
    count: int = 0
    reason: str = ""  # why there is no accelerator
    product: str | None = None
    torch: str | None = None
    modules: dict[str, bool] = field(default_factory=dict)


@dataclass
class Check:
    """One check: a command, what it needs, and how to read its figures."""

    name: str
    command: list[str]
    needs: tuple[str, ...] = ()  # Python modules
    parse: Callable[[str, Path], dict] | None = None  # (output, work dir) -> figures
    notes: list[str] = field(default_factory=list)
    result: dict = field(default_factory=dict)
    #: A pytest module's JUnit XML: its counts, not its output, say how it went.
    junit: Path | None = None


# ---- the machine ---------------------------------------------------------------------------
def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package that is absent or broken
        return False


def detect(requested: str | None) -> Machine:
    """The accelerator the device layer finds (npu, then cuda), or why there is none."""
    modules = {m: has_module(m) for m in ("pytest", "megatron.core", "transformers", "ray", "vllm")}
    try:
        import torch
    except Exception as exc:  # any import failure: no usable torch here
        return Machine(None, reason=f"torch does not import: {exc}", modules=modules)
    from backends.device.registry import DEVICE_CLASSES

    names = [requested] if requested else ["npu", "cuda"]
    reasons = []
    for name in names:
        reason = DEVICE_CLASSES[name].unavailable_reason()
        if reason is None:
            count = DEVICE_CLASSES[name]().device_count()
            return Machine(
                name, count, product=product_name(name), torch=torch.__version__, modules=modules
            )
        reasons.append(f"{name}: {reason}")
    return Machine(None, reason="; ".join(reasons), torch=torch.__version__, modules=modules)


def product_name(device: str) -> str | None:
    """The accelerator's product name from the vendor's tool, if it is on PATH."""
    tool = {"cuda": ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]}.get(device)
    if tool is None or shutil.which(tool[0]) is None:
        return None
    out = subprocess.run(tool, capture_output=True, text=True, check=False).stdout.strip()
    return out.splitlines()[0].strip() if out else None


def peak_tflops(machine: Machine) -> float | None:
    """MINDRL_PEAK_TFLOPS, else the table's figure for the product name."""
    if os.environ.get("MINDRL_PEAK_TFLOPS"):
        return float(os.environ["MINDRL_PEAK_TFLOPS"])
    for piece, tflops in PEAK_TFLOPS:
        if machine.product and piece in machine.product:
            return tflops
    return None


# ---- figures ----------------------------------------------------------------------------------
def last_json_document(text: str) -> dict:
    """The last top-level JSON object printed with indent (starts with a line ``{``)."""
    start = text.rindex("\n{\n") + 1 if "\n{\n" in text else text.index("{\n")
    document, _ = json.JSONDecoder().raw_decode(text[start:])
    return document


def junit_counts(path: Path) -> dict:
    """Test counts and skip reasons from pytest's JUnit XML."""
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    reasons = {
        skip.get("message", "")
        for case in suite.iter("testcase")
        for skip in case.findall("skipped")
    }
    counts["skip_reasons"] = sorted(reasons)
    return counts


def reshard_figures(report: dict) -> dict:
    """The swap against the pinned copy, and the redundant bytes, per rank."""
    keys = ("swap_out_gbps", "swap_in_gbps", "swapped_bytes", "redundant_bytes")
    ranks = [
        {
            "rank": r["rank"],
            "pinned_d2h_gbps": r["pinned_d2h_gbps"],
            "pinned_h2d_gbps": r["pinned_h2d_gbps"],
        }
        | {k: r["allgather_swap"][k] for k in keys}
        | {"naive_redundant_bytes": r["naive"]["redundant_bytes"]}
        for r in report["ranks"]
    ]
    return {"device": report["device"], "ranks": ranks, "goals": report["goals"]}


def rollout_figures(report: dict) -> dict:
    keys = ("engine", "model", "load_weights_s", "tokens_per_s", "start_s")
    return {
        "machine": report["machine"],
        "rows": [{k: f[k] for k in keys} for f in report["figures"]],
    }


def run_figures(run_dir: Path) -> dict:
    """The last iteration's record of a training run."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    last = json.loads(lines[-1])
    keys = ("reward_mean", "tps", "iteration_time_s", "rollout_logprob_diff")
    return {"iterations": len(lines)} | {k: last.get(k) for k in keys}


# ---- the checks -------------------------------------------------------------------------------
def accelerator_test_files() -> list[Path]:
    files = sorted((ROOT / "tests").rglob("test_*.py"))
    return [p for p in files if ACCELERATOR_TEST.search(p.read_text())]


def test_checks(python: str, work: Path) -> list[Check]:
    """One pytest run per module, so a module whose imports fail does not hide the rest."""
    checks = []
    for path in accelerator_test_files():
        rel = path.relative_to(ROOT)
        xml = work / (str(rel.with_suffix("")).replace(os.sep, "-") + ".xml")
        command = [
            python,
            "-m",
            "pytest",
            "-m",
            MARKERS,
            "-rs",
            "-q",
            str(rel),
            f"--junitxml={xml}",
            "-p",
            "no:cacheprovider",
        ]

        def parse(_out: str, _work: Path, xml: Path = xml) -> dict:
            return junit_counts(xml)

        checks.append(Check(f"tests {rel}", command, ("pytest",), parse, junit=xml))
    return checks


def benchmark_checks(python: str, machine: Machine, work: Path) -> list[Check]:
    device = machine.device or "auto"
    two = machine.count >= 2
    tps = "1,2" if two else "1"
    # ~1B dense model in bf16, 16K tokens per step in micro-batches of 2 x 2048 tokens.
    train = [python, *shlex.split(
        f"benchmarks/train_step.py --device {device} --models dense-1b --tp {tps} --seq 2048 "
        "--micro-batch 2 --micro-batches 4 --steps 5 --warmup 2 --json"
    )]  # fmt: skip
    peak = peak_tflops(machine)
    notes = []
    if peak is None:
        notes.append("MFU not computed: unknown peak TFLOPS (set MINDRL_PEAK_TFLOPS)")
    else:
        train += ["--peak-tflops", str(peak)]
    world = "--world 2" if two else "--world 1 --layout-world 2"
    reshard_json = work / "reshard.json"
    # A 4-layer slice of a 7B-class model: about 1 GB of bf16 training shards per rank,
    # enough for the swap to run at the link's bandwidth.
    reshard = [python, *shlex.split(
        f"benchmarks/reshard.py --measure {world} --train-tp 2 --gen-tp 1 --hidden 4096 "
        "--layers 4 --heads 32 --kv-heads 8 --ffn 11008 --vocab 32000 --dtype bfloat16 "
        f"--bucket-mib 256 --device {device} --json {reshard_json}"
    )]  # fmt: skip
    rollout_json = work / "rollout.json"
    rollout = [python, "benchmarks/rollout.py", "--json", str(rollout_json)]
    rollout_notes = [] if machine.modules.get("vllm") else ["vllm not installed: hf engine only"]
    return [
        Check(
            "train_step dense-1b MFU",
            train,
            ("megatron.core",),
            lambda out, _w: last_json_document(out),
            notes,
        ),
        Check(
            "reshard --measure swap bandwidth",
            reshard,
            (),
            lambda _o, _w: reshard_figures(json.loads(reshard_json.read_text())),
        ),
        Check(
            "rollout weight hand-over",
            rollout,
            ("transformers",),
            lambda _o, _w: rollout_figures(json.loads(rollout_json.read_text())),
            rollout_notes,
        ),
    ]


def run_check(python: str, machine: Machine, work: Path) -> Check:
    """A short GRPO run of configs/tiny.yaml on the accelerator (Ray places the workers)."""
    devices = min(max(machine.count, 1), 2)
    device = machine.device or "auto"
    run_dir = work / "grpo-tiny"
    command = [python, *shlex.split(
        f"-m trainers.driver.cli --trainer grpo --config configs/tiny.yaml --device {device} "
        f"iterations=5 resources.devices_per_node={devices} actor.parallel.tp={devices} "
        f"reference.parallel.tp={devices} critic.parallel.tp={devices} logging.dir={run_dir}"
    )]  # fmt: skip
    needs = ("ray", "megatron.core", "transformers")
    return Check("grpo tiny run", command, needs, lambda _o, _w: run_figures(run_dir))


def all_checks(python: str, machine: Machine, work: Path) -> list[Check]:
    return [
        *test_checks(python, work),
        *benchmark_checks(python, machine, work),
        run_check(python, machine, work),
    ]


# ---- running ----------------------------------------------------------------------------------
def skip(check: Check, reason: str) -> None:
    check.result = {"status": f"skipped: {reason}", "rc": None, "seconds": 0.0}


def missing_module(output: str) -> str | None:
    """The third-party module whose import failed last (mindrl's own modules do not count)."""
    names = re.findall(r"ModuleNotFoundError: No module named '([\w.]+)'", output)
    if names and names[-1].split(".")[0] not in OWN_PACKAGES:
        return names[-1]
    return None


def execute(check: Check, machine: Machine, timeout_s: float) -> None:
    missing = [m for m in check.needs if not machine.modules.get(m, has_module(m))]
    if missing:
        skip(check, f"needs {', '.join(missing)} (not installed)")
        return
    path = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = os.environ | {"PYTHONPATH": os.pathsep.join(path)}
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            check.command,
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        rc, stdout, output = proc.returncode, proc.stdout, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        partial = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        rc, stdout, output = None, partial, f"timed out after {timeout_s:.0f} s\n{partial}"
    result: dict = {"rc": rc, "seconds": round(time.perf_counter() - start, 1)}
    if check.junit is not None and rc is not None and check.junit.exists():
        result |= test_module_result(check.junit)
    else:
        result |= command_result(check, rc, stdout, output)
    if result["status"] != "passed":
        result["output_tail"] = output[-TAIL_CHARS:]
    check.result = result


def command_result(check: Check, rc: int | None, stdout: str, output: str) -> dict:
    """A benchmark or run: its exit status, and its figures when it passed. A non-zero
    exit whose last error is a third-party import is a skip naming the module."""
    module = missing_module(output) if rc not in (0, None) else None
    if module is not None:
        return {"status": f"skipped: needs {module} (import failed)"}
    if rc is None:
        return {"status": "failed: timed out"}
    if rc != 0:
        return {"status": "failed"}
    try:
        return {"status": "passed", "figures": check.parse(stdout, ROOT) if check.parse else {}}
    except Exception as exc:  # the check ran; only reading its figures failed
        return {"status": f"failed: figures unreadable ({type(exc).__name__}: {exc})"}


def test_module_result(xml: Path) -> dict:
    """A pytest module's status from its JUnit counts alone: any failure or error is
    ``failed``, whatever the output mentions (a skip reason naming a missing module, say);
    every test skipped or none selected is a skip; else passed."""
    try:
        figures = junit_counts(xml)
    except ET.ParseError as exc:
        return {"status": f"failed: JUnit XML unreadable ({exc})"}
    if figures["failures"] or figures["errors"]:
        status = f"failed: {figures['failures']} failed, {figures['errors']} errors"
    elif figures["tests"] == 0:
        status = "skipped: no test selected"
    elif figures["skipped"] == figures["tests"]:
        status = f"skipped: all {figures['tests']} tests skipped (see skip_reasons)"
    else:
        status = "passed"
    return {"status": status, "figures": figures}


def summary(machine: Machine, checks: list[Check], python: str) -> dict:
    statuses = [c.result["status"] for c in checks]
    return {
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": f"{python} ({platform.python_version()})",
        "torch": machine.torch,
        "accelerator": {
            "device": machine.device,
            "count": machine.count,
            "product": machine.product,
            "absent_because": machine.reason or None,
        },
        "modules": machine.modules,
        "checks": [
            {"name": c.name, "command": shlex.join(c.command), **c.result}
            | ({"notes": c.notes} if c.notes else {})
            for c in checks
        ],
        "counts": {
            "passed": statuses.count("passed"),
            "failed": sum(s.startswith("failed") for s in statuses),
            "skipped": sum(s.startswith("skipped") for s in statuses),
        },
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("accelerator_checks.json"),
        help="the JSON summary (default ./accelerator_checks.json)",
    )
    parser.add_argument(
        "--device",
        choices=("cuda", "npu"),
        default=None,
        help="the accelerator to check (default: detect, npu then cuda)",
    )
    parser.add_argument("--only", default=None, help="run only checks whose name has this")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per check")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    python = sys.executable
    machine = detect(args.device)
    with tempfile.TemporaryDirectory(prefix="mindrl-accel-") as tmp:
        work = Path(tmp)
        checks = all_checks(python, machine, work)
        if args.only:
            checks = [c for c in checks if args.only in c.name]
        if machine.device is None:
            print(
                f"accelerator checks: no accelerator ({machine.reason}); all "
                f"{len(checks)} checks skipped, summary in {args.out}"
            )
            for check in checks:
                skip(check, "no accelerator")
        else:
            print(
                f"accelerator checks on {machine.count} x {machine.device} "
                f"({machine.product or 'product unknown'}), torch {machine.torch}"
            )
            absent = [m for m, ok in machine.modules.items() if not ok]
            if absent:
                print(f"not installed: {', '.join(absent)} (the checks needing them are skipped)")
            for check in checks:
                execute(check, machine, args.timeout)
                extra = f" ({'; '.join(check.notes)})" if check.notes else ""
                print(
                    f"  {check.result['status']:<10} {check.result['seconds']:7.1f} s  "
                    f"{check.name}{extra}",
                    flush=True,
                )
        report = summary(machine, checks, python)
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    if machine.device is not None:
        counts = report["counts"]
        print(
            f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} "
            f"skipped; summary in {args.out}"
        )
    if machine.torch is None:
        return 2
    return 1 if report["counts"]["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
