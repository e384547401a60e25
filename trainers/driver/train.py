"""``mindrl-train``'s run: Ray workers, the dock, the iteration loop, checkpoints.

:func:`train` is what the CLI calls. It connects to Ray (an existing cluster from
``resources.ray_address`` / ``$RAY_ADDRESS``, else a local one), starts the dock and the
worker groups (:mod:`trainers.driver.setup`), then runs iterations
(:mod:`trainers.driver.iteration`), logging one progress line each, checkpointing every
``checkpoint.every`` iterations and at the end (with the samples a later iteration
trains, when the runner keeps some in flight). A dead worker, a stage past its
deadline or a failing worker ends the run with a one-line message naming the worker and
the stage (exit 1); Ctrl-C saves a checkpoint of the last finished iteration when the
workers still answer and exits 130.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from backends.device.registry import get_device, resolve_device
from backends.megatron import checkpoint
from mindrl.config.schema import MindRLConfig
from mindrl.config.specs import ModelSetupError
from mindrl.data import PromptSourceError
from mindrl.metrics import MetricsLogger, format_progress_line, print_progress_line
from mindrl.metrics.memory import peaks_by_role
from mindrl.metrics.sinks import SinkError
from mindrl.planner.capacity import device_bytes
from mindrl.planner.check import (
    MEMORY_CHECK_FILE,
    check_memory,
    format_memory_check,
    write_memory_check,
)
from mindrl.reshard import LayoutError
from mindrl.rewards.report import RewardsFailed
from mindrl.workers.group import (
    WorkerOutOfMemoryError,
)
from mindrl.workers.placement import PlacementError
from trainers.driver.iteration import IterationRunner
from trainers.driver.preemption import Preempted, PreemptionNotice, resume_command
from trainers.driver.restarts import RUN_FAILURES, Restarts
from trainers.driver.runners import make_runner
from trainers.driver.setup import RunSetupError, launch_run, prepare_run, stop_run
from trainers.driver.state import RunState
from trainers.driver.validation import Validator
from trainers.export import BASE_OUT, export_adapter, export_checkpoint, write_tokenizer

USER_MISTAKES = (
    RunSetupError,
    ModelSetupError,
    PromptSourceError,
    LayoutError,
    SinkError,
    PlacementError,
)


class CheckpointWriteFailed(RuntimeError):
    """A checkpoint could not be written and the run stops (``checkpoint.on_error: stop``,
    or the run's final checkpoint); the message is one line with the fix."""


#: How long a Ctrl-C checkpoint may take before the run gives up on it.
INTERRUPT_SAVE_TIMEOUT_S = 120.0
HF_DIR = "hf"  # RUN_DIR/hf: the trained policy, loadable by transformers and vLLM
ADAPTER_DIR = "hf_adapter"  # RUN_DIR/hf_adapter: a LoRA run's adapters as PEFT loads them


def train(
    config: MindRLConfig,
    trainer: str,
    device: str | None = None,
    resume: bool | str = False,
    command: Sequence[str] | None = None,
) -> int:
    """Run ``config`` with algorithm ``trainer``; returns the process exit code.

    ``resume``: True continues from the latest checkpoint, a path from that checkpoint (a
    run's checkpoints folder or one role's step folder). ``command``: the ``mindrl-train``
    arguments the run was started with, for the resume command a preempted run prints.
    A run failure that :mod:`trainers.driver.restarts` may get past starts the workers
    again from the latest complete checkpoint, up to ``resilience.max_restarts`` times.
    """
    device_name = resolve_device(device)
    notice = PreemptionNotice(config.resilience.preempt_timeout_s)
    restarts = Restarts(config.resilience.max_restarts)
    with notice:
        while True:
            run: RunState | None = None
            runner: IterationRunner | None = None
            try:
                run = prepare_run(config, trainer, resume)
                validator = Validator.for_run(run)  # a bad val_source stops it before Ray
                launch_run(run, device_name, resume, on_connected=notice.listen)
                runner = make_runner(run)
                if run.in_flight is not None:  # its samples are back in the dock (rank 0)
                    runner.restore_in_flight(run.in_flight)
                code = _loop(run, runner, validator, notice, restarts)
                _print_memory_check(run, runner, device_name)
                return code
            except USER_MISTAKES as exc:
                _error(str(exc))
                return 2
            except Preempted:
                _on_preempted(run, runner, notice, command)
                return 0
            except RUN_FAILURES as exc:
                if run is None or not restarts.allow(exc):
                    _report_failure(exc, run, runner)
                    return 1
                _write_error_log(exc, run, f"restart {restarts.done + 1} after")
                resume = restarts.begin(exc, run.checkpoint_dir, resume)
            except CheckpointWriteFailed as exc:
                _error(str(exc))
                return 1
            except RewardsFailed as exc:  # before the failing batch trained
                _error(str(exc))
                _save_finished(run, runner, "stopped")
                return 1
            except KeyboardInterrupt:
                _save_finished(run, runner, "interrupted")
                return 130
            finally:
                if run is not None:
                    stop_run(run)


def _loop(
    run: RunState,
    runner: IterationRunner,
    validator: Validator,
    notice: PreemptionNotice,
    restarts: Restarts,
) -> int:
    config = run.config
    resume_at = run.start_iteration if run.resumed else None
    sinks, settings = config.logging.backends, config.logging.sink_settings()
    with MetricsLogger(run.run_dir, sinks, resume_at, settings) as log:
        for iteration in range(run.start_iteration, config.iterations):
            run.iterating = True
            metrics = runner.run_iteration(iteration)
            # Trained: a Ctrl-C during validation saves this iteration, not the one before.
            run.finished_iteration, run.iterating = iteration, False
            metrics |= validator.after(iteration)
            if run.checkpoint_failures:
                metrics["checkpoint_write_failures"] = run.checkpoint_failures
            if notes := restarts.take_notes():  # the first record after a restart says so
                metrics["restarts"] = notes
            log.log(iteration, metrics)
            print_progress_line(format_progress_line(iteration, metrics))
            if notice.received and iteration + 1 < config.iterations:
                notice.disarm()
                raise Preempted  # the save is train()'s, within the notice's bound
            every = config.checkpoint.every
            if every and (iteration + 1) % every == 0 and iteration + 1 < config.iterations:
                started = time.perf_counter()  # a preemption's save gets twice this
                save_checkpoint(run, runner, background=config.checkpoint.async_save)
                notice.last_save_s = time.perf_counter() - started
        if run.finished_iteration >= run.start_iteration:
            notice.disarm()  # the last iteration is done: its save finishes the run
            save_checkpoint(run, runner, final=True)  # waits for a background one first
            _write_hf(run)
    _plot(run.run_dir)
    print(f"mindrl-train: done; metrics in {run.run_dir}, checkpoints in {run.checkpoint_dir}")
    return 0


def _print_memory_check(run: RunState, runner: IterationRunner, device_name: str) -> None:
    """The planner's memory beside the run's measured peaks: per device, or per worker's
    resident size where the device is the host (never fatal: a config the planner cannot
    size still trained). Also written to ``RUN_DIR/memory_check.json``, the figures
    scripts/accelerator_checks.py reports."""
    try:
        bytes_per_device = device_bytes(run.config, device_name)
        device = get_device(device_name)
        checks = check_memory(
            run.config,
            run.plan,
            bytes_per_device,
            runner.stage_peaks,
            device.shares_host_memory,
            device.library_workspace_bytes,
        )
    except (ValueError, KeyError) as exc:  # CapacityError included
        _error(f"no planned-vs-measured memory: {exc}")
        return
    write_memory_check(checks, run.run_dir / MEMORY_CHECK_FILE)
    line = format_memory_check(checks)
    if line:
        print(f"mindrl-train: {line}")


def _write_hf(run: RunState) -> None:
    """The trained policy as an HF folder, ``RUN_DIR/hf``, from the final checkpoint, with
    the tokenizer's files when the tokenizer came from an HF folder or a GGUF file. A LoRA
    run also writes its adapters as a PEFT folder, ``RUN_DIR/hf_adapter``, on the base's
    HF folder (``RUN_DIR/hf_base`` where the base has none of its own)."""
    if run.config.env.embodied:  # no HF architecture holds a vision-language-action policy
        _say(f"no HF export of model.family={run.config.model.family}; its checkpoints stand")
        return
    out = export_checkpoint(run.checkpoint_dir, run.run_dir / HF_DIR)
    write_tokenizer(run.config.model.tokenizer, out)
    print(f"mindrl-train: trained model (HF) in {out}", file=sys.stderr)
    if not run.config.actor.lora.enabled:
        return
    base = run.run_dir / BASE_OUT
    adapter = export_adapter(run.checkpoint_dir, run.run_dir / ADAPTER_DIR, base)
    if base.is_dir():
        write_tokenizer(run.config.model.tokenizer, base)
    print(f"mindrl-train: trained LoRA adapter (PEFT) in {adapter}", file=sys.stderr)


def save_checkpoint(
    run: RunState,
    runner: IterationRunner | None = None,
    timeout_s: float | None = None,
    background: bool = False,
    final: bool = False,
) -> float:
    """Every trained role saves; returns the seconds it took (a background save: until
    the workers' host copies were made). The the driver's position (next iteration, data, KL) rides
    along. Between iterations the ``runner``'s samples in flight (partial rollout, an
    asynchronous run's next batch) are kept too: its bookkeeping in the position, their
    payloads written by actor rank 0 into its step folder. ``background``
    (``checkpoint.async``): the workers return once their parts are copied to host memory
    and write them while the run goes on; each save waits for the one before, so a run
    that ends waits for it, and one that fails leaves ``latest`` on a complete step.

    A save that could not be written (this one, or the background one before it) goes by
    ``checkpoint.on_error``; the ``final`` one always stops the run.

    Raises:
        CheckpointWriteFailed: a save could not be written and the run stops.
    """
    in_flight = runner.in_flight_state() if runner is not None and not run.iterating else None
    position = run.position(in_flight.bookkeeping if in_flight is not None else None)
    timeout = timeout_s or run.plan.stage_deadline_s
    start = time.perf_counter()
    answers = {}
    for group in run.trained_groups():
        root = str(run.checkpoint_dir)
        args = [root, position]
        if in_flight is not None and group.name == "actor":
            args.append(in_flight.slices)
        kwargs = {"background": True} if background else {}
        # Every rank of a role answers alike (its ranks agree on a failed write).
        answers[group.name] = group.call(
            "save_checkpoint", *args, stage="checkpoint", timeout_s=timeout, **kwargs
        )[0]
    seconds = time.perf_counter() - start
    failed = {step: line for answer in answers.values() for step, line in answer["failed"]}
    if failed:
        _after_failed_writes(run, answers, failed, final)
    checkpoint.prune_run(run.checkpoint_dir, list(answers), run.config.checkpoint.keep)
    if all(answer["step_dir"] for answer in answers.values()):
        writing = "; writing in the background" if background else ""
        print_progress_line(
            f"checkpoint: iteration {run.finished_iteration} -> {run.checkpoint_dir} "
            f"({seconds:.1f}s{writing})"
        )
    return seconds


def _after_failed_writes(
    run: RunState, answers: dict[str, dict], failed: dict[str, str], final: bool
) -> None:
    """Checkpoint steps some role could not write (step folder name -> its line): the
    roles that did write such a step unpublish it, so every role's ``latest`` names one
    step; then the run stops or, under ``checkpoint.on_error: warn``, counts and goes on."""
    for role, answer in answers.items():
        own = {step for step, _ in answer["failed"]}
        for step in set(failed) - own:
            checkpoint.withdraw(Path(run.checkpoint_dir) / role, step)
    line = next(iter(failed.values()))
    fix = (
        f"free space (or grant write access) under {run.checkpoint_dir}, or point "
        "checkpoint.dir at another disk"
    )
    if final:
        raise CheckpointWriteFailed(f"the run's final checkpoint is lost: {line}; {fix}")
    if run.config.checkpoint.on_error == "stop":
        raise CheckpointWriteFailed(
            f"{line}; {fix}, or set checkpoint.on_error=warn to train on without it"
        )
    run.checkpoint_failures += len(failed)
    _say(
        f"warning: {line}; training goes on (checkpoint.on_error=warn; "
        f"{run.checkpoint_failures} failed so far)"
    )


def _save_finished(run: RunState | None, runner: IterationRunner | None, why: str) -> None:
    """Save the last finished iteration of a run that ends mid-way (``why``: interrupted,
    stopped), so nothing it trained is lost; one line says what became of it."""
    if run is None or run.finished_iteration < run.start_iteration:
        _say(f"{why} before the first iteration finished; nothing new to save")
        return
    try:
        # Ended inside an iteration, the runner's samples in flight are half-way
        # through it: save_checkpoint keeps none of them then (run.iterating).
        save_checkpoint(run, runner, INTERRUPT_SAVE_TIMEOUT_S)
        _say(
            f"{why}; saved iteration {run.finished_iteration} to {run.checkpoint_dir} "
            "(continue with --resume)"
        )
    except (*RUN_FAILURES, CheckpointWriteFailed, KeyboardInterrupt) as exc:
        _say(
            f"{why}; could not save ({exc}); the last complete checkpoint under "
            f"{run.checkpoint_dir} is intact"
        )


def _on_preempted(
    run: RunState | None,
    runner: IterationRunner | None,
    notice: PreemptionNotice,
    command: Sequence[str] | None,
) -> None:
    """Save the last finished iteration within what is left of the bound, or say which
    complete checkpoint stands when the iteration in progress was abandoned; one line
    ending with the command that resumes the run."""
    notice.disarm()  # nothing may interrupt the save now
    resume = resume_command(command) if command is not None else "the same command with --resume"
    if run is None or run.iterating or run.finished_iteration < run.start_iteration:
        latest = checkpoint.latest_dir(run.checkpoint_dir / "actor") if run is not None else None
        where = (
            "start-up"
            if run is None or not run.iterating
            else (f"iteration {run.finished_iteration + 1}")
        )
        if latest is None:
            _say(f"preempted during {where}; no checkpoint yet: start the run again")
        else:
            _say(
                f"preempted; {where} could not finish within resilience.preempt_timeout_s="
                f"{notice.timeout_s:g}, the last complete checkpoint is {latest}; "
                f"resume with: {resume}"
            )
        return
    try:
        seconds = save_checkpoint(run, runner, max(notice.remaining_s(), 1.0), final=True)
    except (*RUN_FAILURES, CheckpointWriteFailed) as exc:
        _say(
            f"preempted; could not save iteration {run.finished_iteration} ({exc}); the last "
            f"complete checkpoint under {run.checkpoint_dir} stands; resume with: {resume}"
        )
        return
    elapsed = notice.timeout_s - notice.remaining_s()
    _say(
        f"preempted; saved iteration {run.finished_iteration} to {run.checkpoint_dir} "
        f"({seconds:.1f} s; exit {elapsed:.1f} s after SIGTERM, bound "
        f"{notice.timeout_s:g} s); resume with: {resume}"
    )


def _report_failure(
    exc: Exception, run: RunState | None, runner: IterationRunner | None = None
) -> None:
    _error(_failure_line(exc, run, runner))
    if run is not None:
        log = _write_error_log(exc, run, "failed")
        _error(f"details in {log}; the last complete checkpoint is under {run.checkpoint_dir}")


def _write_error_log(exc: Exception, run: RunState, what: str) -> Path:
    """``RUN_DIR/error.log``: a stamped header (``mindrl-train <what> at ...``) and the
    failure's whole traceback (a worker's, when it raised)."""
    log = Path(run.run_dir) / "error.log"
    # A worker can die during start-up, before the metrics logger made the folder.
    log.parent.mkdir(parents=True, exist_ok=True)
    # Stamped: a later successful run in the same folder leaves this file behind.
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    header = f"mindrl-train {what} at {stamp} after iteration {run.finished_iteration}\n"
    details = getattr(exc, "details", None)
    log.write_text(header + (details or "".join(traceback.format_exception(exc))))
    return log


def _failure_line(exc: Exception, run: RunState | None, runner: IterationRunner | None) -> str:
    """The one line; a worker killed for memory also gets its role's peak so far."""
    if isinstance(exc, WorkerOutOfMemoryError) and run is not None and runner is not None:
        peaks = peaks_by_role(runner.stage_peaks, run.plan.stage_roles())
        return exc.line(peaks.get(exc.role))
    return str(exc)


def _plot(run_dir: Path) -> None:
    try:
        from mindrl.metrics.plot import plot_metrics

        png = plot_metrics(run_dir / "metrics.jsonl", run_dir / "curves.png")
        print(f"mindrl-train: curves in {png}")
    except (ImportError, ValueError) as exc:  # plotting is a convenience, never fatal
        _error(f"no curves plotted: {exc}")


def _error(message: str) -> None:
    for line in message.splitlines() or [message]:
        print(f"mindrl-train: error: {line}", file=sys.stderr)


def _say(message: str) -> None:
    print(f"mindrl-train: {message}", file=sys.stderr)
