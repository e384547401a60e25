"""Every accelerator check in one run, summed up in one JSON file.

Run it through ``scripts/accelerator_checks.sh``. On a machine with a GPU or NPU it runs,
in this order: the training step's MFU on a ~1B dense model against the issue's goal
(``benchmarks/train_step.py``), the tests marked ``cuda`` / ``npu`` / ``multi_device``
(one pytest per module, judged by its JUnit counts), four short training runs on one
device (:data:`RUNS`: the 0.18B llama's planned vs measured memory per stage, GRPO tiny
with a reference, PPO tiny, tiny_deepseek at TP1 EP1), the swap bandwidth
against a pinned copy (``benchmarks/reshard.py --measure``) and the generation engines'
weight hand-over (``benchmarks/rollout.py``). Each check has a time limit, all of them
``--budget`` seconds (a 10-minute device call with time to spare); a check past its limit
is killed with its process group (a run's Ray processes too). ``--device cpu`` runs the
training runs alone on the CPU, shortened, to show their figures. A check whose Python
packages are missing is skipped with their names; nothing is installed. Without an
accelerator every check is skipped and the exit status is 0. Exit status 1: a check
failed; 2: torch does not import.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
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
#: The MFU goals of a dense-1b bf16 train_step at sequence 2048 on one device, without and
#: with TransformerEngine.
MFU_GOAL, MFU_GOAL_WITH_TE = 0.35, 0.45
#: The metric that says how much of an update's forward was padding (1.0: none).
PADDING = "train_tokens_per_real_token"
#: Seconds the whole script may take: a 10-minute device call with time to spare.
BUDGET_S = 540.0
#: A check is not started with less time than this left in the budget.
MIN_CHECK_S = 30.0
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
    #: Seconds it may take on the device (the whole run has ``--budget`` seconds).
    timeout_s: float = 150.0


# ---- the machine ---------------------------------------------------------------------------
def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package that is absent or broken
        return False


def detect(requested: str | None) -> Machine:
    """The accelerator the device layer finds (npu, then cuda), or why there is none."""
    packages = ("pytest", "megatron.core", "transformers", "ray", "vllm", "transformer_engine")
    modules = {m: has_module(m) for m in packages}
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
    """A training run's figures: iterations, the median iteration time after the first
    (which compiles and allocates), the reward of the first and last iterations, the
    generation / training log-prob gap (last and largest), the update's computed tokens
    per real token (largest: 1.0 = no padding), and the end-of-run memory check per stage
    (planned vs measured, ``memory_check.json``)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    times = [r["iteration_time_s"] for r in records[1:]] or [records[0]["iteration_time_s"]]
    diffs = [r["rollout_logprob_diff"] for r in records if "rollout_logprob_diff" in r]
    padding = [r[PADDING] for r in records if PADDING in r]
    figures = {
        "iterations": len(records),
        "first_iteration_s": round(records[0]["iteration_time_s"], 3),
        "iteration_time_s": round(statistics.median(times), 3),
        "reward_mean_first": records[0].get("reward_mean"),
        "reward_mean_last": records[-1].get("reward_mean"),
        "rollout_logprob_diff": diffs[-1] if diffs else None,
        "rollout_logprob_diff_max": max(diffs) if diffs else None,
        "tps": records[-1].get("tps"),
        PADDING: round(max(padding), 4) if padding else None,
    }
    return figures | {"memory": memory_figures(run_dir / "memory_check.json")}


def memory_figures(path: Path) -> dict | None:
    """Per stage: planned and measured GiB, measured / planned, what was measured and, for
    device bytes, whether it is within the planner's tolerance; None without the file
    (the run ended before its memory check)."""
    if not path.exists():
        return None
    check = json.loads(path.read_text())
    gib = 2**30
    return {
        row["stage"]: {
            "planned_gib": round(row["planned_bytes"] / gib, 3),
            "measured_gib": None
            if row["measured_bytes"] is None
            else round(row["measured_bytes"] / gib, 3),
            "ratio": row["ratio"],
            "measured_as": row["measured_as"],
            "within_tolerance": row["within_tolerance"],
        }
        for row in check["stages"]
    } | {"tolerance": check["tolerance"]}


def train_step_figures(output: str, goal: float) -> dict:
    """train_step's JSON and, per row, whether its MFU reaches ``goal`` (35 %
    without TransformerEngine, 45 % with it: ``MFU_GOAL``)."""
    report = last_json_document(output)
    for row in report.get("results", []):
        row["mfu_goal"] = goal
        row["meets_goal"] = None if row.get("mfu") is None else row["mfu"] >= goal
    return report


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

        checks.append(Check(f"tests {rel}", command, ("pytest",), parse, junit=xml, timeout_s=150))
    return checks


def benchmark_checks(python: str, machine: Machine, work: Path) -> list[Check]:
    device = machine.device or "auto"
    two = machine.count >= 2
    tps = "1,2" if two else "1"
    # ~1B dense model in bf16, 16K tokens per step in micro-batches of 2 x 2048 tokens.
    train = [python, *shlex.split(
        f"benchmarks/train_step.py --device {device} --models dense-1b --tp {tps} --seq 2048 "
        "--micro-batch 2 --micro-batches 4 --steps 5 --warmup 2 --profile 1 --json"
    )]  # fmt: skip
    peak = peak_tflops(machine)
    with_te = machine.modules.get("transformer_engine", False)
    goal = MFU_GOAL_WITH_TE if with_te else MFU_GOAL
    notes = [f"TransformerEngine {'installed' if with_te else 'absent'}: MFU goal {goal:.0%}"]
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
            lambda out, _w: train_step_figures(out, goal),
            notes,
            timeout_s=180,
        ),
        Check(
            "reshard --measure swap bandwidth",
            reshard,
            (),
            lambda _o, _w: reshard_figures(json.loads(reshard_json.read_text())),
            timeout_s=120,
        ),
        Check(
            "rollout weight hand-over",
            rollout,
            ("transformers",),
            lambda _o, _w: rollout_figures(json.loads(rollout_json.read_text())),
            rollout_notes,
            timeout_s=120,
        ),
    ]


@dataclass(frozen=True)
class RunSpec:
    """A short training run on one device: its trainer, config and overrides."""

    name: str
    trainer: str
    config: str
    overrides: tuple[str, ...]
    iterations: int
    timeout_s: float
    cpu_overrides: tuple[str, ...] = ()  # what makes it short enough on a CPU


#: Every model role on one device (TP 1): the roles share it, as a one-device user runs.
ONE_DEVICE = (
    "resources.devices_per_node=1",
    *(f"{role}.parallel.tp=1" for role in ("actor", "reference", "critic")),
    *(f"{role}.parallel.ep=1" for role in ("actor", "reference", "critic")),
)
#: The first GPU run's 0.18B llama: tiny.yaml at 12 layers, hidden 1024, bf16, GQA 16/4
#: heads, ffn 4096 (182.5M parameters), GRPO over 64 prompts x 8 responses.
SHAPE_018B = (
    "model.dtype=bfloat16",
    "model.num_layers=12",
    "model.hidden_size=1024",
    "model.num_attention_heads=16",
    "model.num_kv_heads=4",
    "model.ffn_hidden_size=4096",
    "data.global_batch_size=64",
    "data.n_samples_per_prompt=8",
)
RUNS = (
    RunSpec(
        "run 0.18b grpo planned vs measured", "grpo", "configs/tiny.yaml",
        (*ONE_DEVICE, *SHAPE_018B), 4, 240,
        cpu_overrides=("model.num_layers=2", "data.global_batch_size=8"),
    ),
    RunSpec(
        "run grpo tiny kl 0.001", "grpo", "configs/tiny.yaml",
        (*ONE_DEVICE, "algorithm.kl_coef=0.001"), 5, 150,
    ),
    RunSpec("run ppo tiny", "ppo", "configs/tiny.yaml", ONE_DEVICE, 5, 150),
    RunSpec("run tiny_deepseek tp1 ep1", "grpo", "configs/tiny_deepseek.yaml", ONE_DEVICE, 5, 150),
)  # fmt: skip


RUN_NAMES = frozenset(spec.name for spec in RUNS)


def run_checks(python: str, machine: Machine, work: Path) -> list[Check]:
    """Each of :data:`RUNS` as ``mindrl-train`` on this machine's device (two iterations,
    and the CPU overrides, with ``--device cpu``); figures from its run folder."""
    checks = []
    on_cpu = machine.device == "cpu"
    for spec in RUNS:
        run_dir = work / spec.name.replace(" ", "-")
        iterations = 2 if on_cpu else spec.iterations
        overrides = [
            *spec.overrides,
            *(spec.cpu_overrides if on_cpu else ()),
            f"iterations={iterations}",
            f"logging.dir={run_dir}",
            "logging.progress_bar=false",
            "checkpoint.every=0",
        ]
        command = [
            python, "-m", "trainers.driver.cli", "--trainer", spec.trainer,
            "--config", spec.config, "--device", machine.device or "auto", *overrides,
        ]  # fmt: skip
        notes = []
        if on_cpu and spec.cpu_overrides:
            notes.append("scaled for the CPU: " + " ".join(spec.cpu_overrides))

        def parse(_out: str, _work: Path, run_dir: Path = run_dir) -> dict:
            return run_figures(run_dir)

        needs = ("ray", "megatron.core", "transformers")
        checks.append(Check(spec.name, command, needs, parse, notes, timeout_s=spec.timeout_s))
    return checks


def all_checks(python: str, machine: Machine, work: Path) -> list[Check]:
    """In the order they run: the training step's MFU, the test modules, the runs, the
    other benchmarks (a spent time budget skips the last ones). The cheapest figures
    come first: on an H100 the MFU took 69 s, the four test modules 84 s, and each run
    ~110 s (Ray's start and the first iteration's FlexAttention compile per process)."""
    benchmarks = benchmark_checks(python, machine, work)
    return [
        benchmarks[0],
        *test_checks(python, work),
        *run_checks(python, machine, work),
        *benchmarks[1:],
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
    rc, stdout, stderr = run_bounded(check.command, env, timeout_s)
    output = stdout + stderr
    if rc is None:
        output = f"timed out after {timeout_s:.0f} s\n{output}"
    result: dict = {"rc": rc, "seconds": round(time.perf_counter() - start, 1)}
    if check.junit is not None and rc is not None and check.junit.exists():
        result |= test_module_result(check.junit)
    else:
        result |= command_result(check, rc, stdout, output)
    if result["status"] != "passed":
        result["output_tail"] = output[-TAIL_CHARS:]
    check.result = result


def run_bounded(command: list[str], env: dict, timeout_s: float) -> tuple[int | None, str, str]:
    """Run ``command`` in its own session; past ``timeout_s`` the whole process group goes
    (a training run's Ray processes with it, which would otherwise keep the device): TERM,
    then KILL. Returns (exit status or None when timed out, stdout, stderr)."""
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
        return proc.returncode, stdout, stderr
    except subprocess.TimeoutExpired:
        for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                stdout, stderr = proc.communicate(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                stdout, stderr = "", ""
        return None, stdout or "", stderr or ""


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
        choices=("cuda", "npu", "cpu"),
        default=None,
        help="the accelerator to check (default: detect, npu then cuda); cpu runs the "
        "training runs on the CPU, shortened, to show their figures (nothing else)",
    )
    parser.add_argument("--only", default=None, help="run only checks whose name has this")
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds per check (default: its own)"
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=BUDGET_S,
        help=f"seconds for all checks; the ones left when it is spent are skipped "
        f"(default {BUDGET_S:.0f}: a 10-minute device call)",
    )
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
            deadline = time.monotonic() + args.budget
            for check in checks:
                left = deadline - time.monotonic()
                if machine.device == "cpu" and check.name not in RUN_NAMES:
                    skip(check, "--device cpu: runs on an accelerator")
                elif left < MIN_CHECK_S:
                    skip(check, f"time budget of {args.budget:.0f} s spent")
                else:
                    execute(check, machine, min(args.timeout or check.timeout_s, left))
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
