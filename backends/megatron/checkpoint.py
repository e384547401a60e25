"""Atomic, sharded, layout-free checkpoints that hold tensors and plain data only.

Layout under ``root`` (one role's folder)::

    step_00000012/
        meta.json                   step, layout, optimizer kind, data position, spec,
                                    format, manifest (every file and its size)
        shards/index.json           every tensor: full shape, dtype, where each box lies
        shards/rank_00000.safetensors  the boxes rank 0 wrote (see sharded_state.py)
        rng/rank_00000.*            each rank's RNG streams
        in_flight.*                 (actor) the dock's samples a later iteration trains
    latest                          text file naming the newest complete step folder
    base/                           (a LoRA run whose base has no file of its own: a random
                                    init) the frozen base, written once (:func:`save_base`)

A LoRA run's step folders hold its adapters and their optimizer state only, and name
their base: its origin (an HF folder or GGUF package, which a resume loads anyway) or
``base/``. A random init is drawn per layout, so a resume at another one could not draw
it again: it is written once, beside the steps, and never rewritten.

The tensors are canonical full tensors (``model/<name>``, ``optim/...``) that each rank
writes a part of, in parallel: what it holds and no replica writes too
(``sharded_state.py``), planned by ``torch.distributed.checkpoint`` and stored as
safetensors with a JSON index (``sharded_store.py``). A resume at another TP / PP / EP /
DP layout, or with the other optimizer, reads the boxes it needs from whichever files
hold them; no rank ever holds a full model or full optimizer state. Nothing is pickled:
tensors go to safetensors, the rest to JSON (:func:`encode`), so loading a tampered
checkpoint cannot run code.

Saving: rank 0 makes ``step_N.tmp``, every rank writes its trees and its shard file into
it, then rank 0 writes ``meta.json`` with the size of every file, renames the folder to
``step_N`` and replaces ``latest`` through a temporary file and ``os.replace``. A crash
at any point leaves ``latest`` naming the previous complete checkpoint. A write that
fails on any rank (a full or failing disk, no permission) is known to every rank after
that step: rank 0 removes the partial folder and every rank raises
:class:`CheckpointWriteError`, so the ranks stay in step and the run may go on. In the
background (:class:`PendingSave`) the tensors are first copied to host memory and a
thread writes and publishes them while training goes on. Loading checks the manifest
first and names a missing, truncated or unreadable file together with the previous
complete step.

Format 2 (full weights in ``model.safetensors``, written before sharded checkpoints) still
loads: ``legacy_checkpoint.py``. The design, and why the storage is not DCP's own:
docs/architecture.md §10.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from backends.megatron.sharded_state import MODEL
from backends.megatron.sharded_store import (
    FileTensors,
    FullTensors,
    LoadPiecesPlanner,
    Pieces,
    PiecesReader,
    PiecesWriter,
    SavePiecesPlanner,
)

LATEST = "latest"
META = "meta.json"
BASE = "base"
SHARDS = "shards"
FORMAT = 3  # 1: per-rank pickled .pt files; 2: full weights (legacy_checkpoint.py)
LEGACY_FORMAT = 2
READABLE_FORMATS = (LEGACY_FORMAT, FORMAT)


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed: one line naming the file and what to do."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint that could not be written (a full or failing disk, no permission): its
    partial folder is removed and ``latest`` still names the previous complete step.
    Every rank raises it, with the same line (the first failing rank's cause)."""

    def __init__(self, message: str, step_dir: Path) -> None:
        super().__init__(message)
        self.step_dir = step_dir


# ---- plain data <-> JSON + tensors ---------------------------------------------------------
def encode(obj: Any, tensors: dict[str, torch.Tensor], path: str = "") -> Any:
    """``obj`` as JSON-able data; its tensors are moved into ``tensors`` under their path."""
    if isinstance(obj, torch.Tensor):
        tensors[path] = obj.detach().cpu().contiguous().clone()
        return {"__tensor__": path}
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": obj.tolist(), "dtype": str(obj.dtype)}
    if isinstance(obj, torch.dtype):
        return {"__dtype__": str(obj).removeprefix("torch.")}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, tuple):
        return {"__tuple__": [encode(v, tensors, f"{path}/{i}") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [encode(v, tensors, f"{path}/{i}") for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj):
            return {k: encode(v, tensors, f"{path}/{k}" if path else k) for k, v in obj.items()}
        return {
            "__items__": [
                [encode(k, tensors, f"{path}/k{i}"), encode(v, tensors, f"{path}/v{i}")]
                for i, (k, v) in enumerate(obj.items())
            ]
        }
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    raise TypeError(f"checkpoint: cannot store a {type(obj).__name__} at '{path}' as plain data")


def decode(data: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of :func:`encode`."""
    if isinstance(data, list):
        return [decode(v, tensors) for v in data]
    if not isinstance(data, dict):
        return data
    if "__tensor__" in data:
        return tensors[data["__tensor__"]]
    if "__ndarray__" in data:
        return np.asarray(data["__ndarray__"], dtype=data["dtype"])
    if "__dtype__" in data:
        return getattr(torch, data["__dtype__"])
    if "__tuple__" in data:
        return tuple(decode(v, tensors) for v in data["__tuple__"])
    if "__items__" in data:
        return {_hashable(decode(k, tensors)): decode(v, tensors) for k, v in data["__items__"]}
    return {k: decode(v, tensors) for k, v in data.items()}


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list | tuple) else key


def save_tree(stem: Path, obj: Any) -> None:
    """``obj`` as ``stem.json`` (structure, plain data) + ``stem.safetensors`` (tensors)."""
    tensors: dict[str, torch.Tensor] = {}
    data = encode(obj, tensors)
    stem.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(stem.with_suffix(".safetensors")))
    stem.with_suffix(".json").write_text(json.dumps(data))


def load_tree(stem: Path) -> Any:
    """Inverse of :func:`save_tree`; reads JSON and safetensors only."""
    tensors = load_file(str(stem.with_suffix(".safetensors")))
    return decode(json.loads(stem.with_suffix(".json").read_text()), tensors)


# ---- RNG -----------------------------------------------------------------------------------
def capture_rng() -> dict[str, Any]:
    """Python, numpy, torch CPU and Megatron's TP tracker states of this rank."""
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "tracker": get_cuda_rng_tracker().get_states(),
    }


def restore_rng(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng`."""
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    get_cuda_rng_tracker().set_states(state["tracker"])


# ---- saving --------------------------------------------------------------------------------
def rank_stem(step_dir: Path, kind: str, rank: int) -> Path:
    return step_dir / kind / f"rank_{rank:05d}"


class PendingSave:
    """A checkpoint being written: :meth:`wait` returns once it is published (at once for a
    synchronous save) and raises if writing it failed (``latest`` then still names the
    previous complete step)."""

    def __init__(self, step_dir: Path, thread: threading.Thread | None = None) -> None:
        self.step_dir = step_dir
        self.thread = thread
        self.error: CheckpointWriteError | None = None

    def wait(self) -> Path:
        """The published step folder.

        Raises:
            CheckpointWriteError: writing it failed on some rank (on every rank alike).
        """
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        return self.step_dir


def save(
    root: str | Path,
    step: int,
    tensors: dict[str, Pieces],
    shared: dict[str, Any],
    per_rank: dict[str, Any],
    meta: dict[str, Any],
    background: bool = False,
) -> PendingSave:
    """Write a checkpoint for ``step`` and publish it as latest (collective).

    Args:
        tensors: this rank's boxes of the checkpoint's full tensors (``sharded_state.py``):
            boxes no other rank offers, or offered identically by replicas (written once).
        shared: name -> tree written by rank 0 (plain data and tensors).
        per_rank: name -> this rank's tree (``None`` values are skipped).
        meta: plain data for ``meta.json`` (step, layout, data position, ...).
        background: copy ``tensors`` to host memory, then write and publish them in a
            thread; the caller goes on and calls :meth:`PendingSave.wait` before the next
            save and before the process ends.
    """
    root = Path(root)
    final = root / f"step_{step:08d}"
    tmp = root / f"step_{step:08d}.tmp"
    rank = dist.get_rank()
    group = _checkpoint_group()
    together = _Together(root, tmp, final, group)

    def make_folder() -> None:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            for name, tree in shared.items():
                save_tree(tmp / name, tree)

    def write_rank_trees() -> None:
        for kind, tree in per_rank.items():
            if tree is not None:
                save_tree(rank_stem(tmp, kind, rank), tree)

    together(make_folder)  # also the barrier: the folder exists before any rank writes
    together(write_rank_trees)
    if background:
        tensors = {key: pieces.host_copy() for key, pieces in tensors.items()}
    record = {"format": FORMAT, **meta}
    pending = PendingSave(final)

    def publish() -> None:
        if rank == 0:
            _publish(root, tmp, final, record)

    def write() -> None:
        try:
            together(lambda: _write_pieces(tensors, tmp, group))
            together(publish)
        except CheckpointWriteError as exc:
            pending.error = exc

    if background:
        pending.thread = threading.Thread(target=write, name=f"checkpoint-{step}", daemon=True)
        pending.thread.start()
        return pending
    write()
    pending.wait()  # every rank returns once the step is published, or raises alike
    return pending


class _Together:
    """One step of a save on every rank, then an exchange of how it went (a gather of one
    line per rank over the checkpoint group; it also serves as the barrier): when any rank
    failed, rank 0 removes the partial folder and every rank raises the same
    :class:`CheckpointWriteError`. Without it a rank whose disk is full would raise while
    the others wait in the next collective, and a run told to go on after a failed save
    (``checkpoint.on_error: warn``) would hang there."""

    def __init__(self, root: Path, tmp: Path, final: Path, group: Any) -> None:
        self.root, self.tmp, self.final, self.group = root, tmp, final, group

    def __call__(self, step: Any) -> None:
        try:
            step()
            mine = None
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # DCP's CheckpointException is a BaseException
            mine = _failure(exc, dist.get_rank())
        outcomes: list[tuple[int, str] | None] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(outcomes, mine, group=self.group)
        failed = [outcome for outcome in outcomes if outcome is not None]
        if not failed:
            return
        if dist.get_rank() == 0:
            self._remove_partial()
        dist.barrier(group=self.group)  # no rank reports before the folder is gone
        rank, cause = min(failed)
        latest = latest_dir(self.root)
        still = f"still names {latest.name}" if latest else "names no step yet (none was written)"
        raise CheckpointWriteError(
            f"checkpoint {self.final} could not be written (rank {rank}: {cause}); its "
            f"partial folder is removed and '{LATEST}' {still}",
            self.final,
        )

    def _remove_partial(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)
        # Renamed but not yet named by `latest` (writing `latest` failed): not published.
        if self.final.exists() and latest_dir(self.root) != self.final:
            shutil.rmtree(self.final, ignore_errors=True)


def _failure(exc: BaseException, rank: int) -> tuple[int, str]:
    """(the rank where ``exc`` began, its one-line cause): a DCP CheckpointException
    carries each failing rank's own exception."""
    failures = getattr(exc, "failures", None)
    if failures:
        rank = min(failures)
        exc = failures[rank][0] if isinstance(failures[rank], tuple) else failures[rank]
    return rank, _first_line(exc)


def _publish(root: Path, tmp: Path, final: Path, record: dict[str, Any]) -> None:
    """Rank 0, once every rank's files are written: the manifest, the rename, ``latest``."""
    _seal(tmp, final, record)
    _write_latest(root, final.name)


def _write_pieces(tensors: Mapping[str, Any], folder: Path, group: Any) -> None:
    """Every rank's pieces of ``tensors`` into ``folder``'s shards (collective)."""
    dcp.save(
        tensors,
        storage_writer=PiecesWriter(folder / SHARDS),
        planner=SavePiecesPlanner(),
        process_group=group,
    )


def _seal(tmp: Path, final: Path, record: dict[str, Any]) -> None:
    """Rank 0: ``meta.json`` with the size of every file, then ``tmp`` renamed ``final``."""
    files = {
        str(p.relative_to(tmp)): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()
    }
    (tmp / META).write_text(json.dumps(encode({**record, "files": files}, {}), indent=1))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)


def save_base(
    root: str | Path, tensors: dict[str, Pieces], meta: dict[str, Any], ours: bool
) -> Path:
    """Write a LoRA run's frozen base once, as ``root/base`` (collective; ``tensors``: this
    rank's boxes of the base weights, ``meta``: plain data for its ``meta.json``). A
    complete one there is kept when it is ``ours`` (this run wrote it, or resumed from
    it: the base never changes during a run); another run's is replaced, as a fresh run
    into the same folder replaces its steps. Returns it.

    Raises:
        CheckpointWriteError: it could not be written (on every rank alike).
    """
    root = Path(root)
    final, tmp = root / BASE, root / f"{BASE}.tmp"
    group = _checkpoint_group()
    present = [ours and final.is_dir() and problem_of(final) is None]
    dist.broadcast_object_list(present, src=0, group=group)  # rank 0's disk decides
    if present[0]:
        return final
    together = _Together(root, tmp, final, group)

    def make_folder() -> None:
        if dist.get_rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)

    def seal() -> None:
        if dist.get_rank() == 0:
            _seal(tmp, final, {"format": FORMAT, **meta})

    together(make_folder)
    together(lambda: _write_pieces(tensors, tmp, group))
    together(seal)
    return final


_GROUPS: dict[int, Any] = {}


def _checkpoint_group():
    """A gloo group over the whole world for checkpoint coordination (collective on first
    use). DCP exchanges its plans as objects, which gloo moves on the host whatever the
    device; and a background save's thread must not share a group with training's
    collectives, which run meanwhile."""
    key = id(dist.distributed_c10d._get_default_group())
    if key not in _GROUPS:
        _GROUPS[key] = dist.new_group(backend="gloo")
    return _GROUPS[key]


def load_tensors(step_dir: Path, tensors: dict[str, Pieces]) -> list[str]:
    """Read into ``tensors`` (views of this rank's live tensors) the boxes they cover from a
    format-3 step folder (collective); returns the names the checkpoint does not hold.

    Raises:
        CheckpointError: a tensor whose saved shape is not this model's.
    """
    planner = LoadPiecesPlanner()
    try:
        dcp.load(
            tensors,
            storage_reader=PiecesReader(step_dir / SHARDS),
            planner=planner,
            process_group=_checkpoint_group(),
        )
    except BaseException as exc:  # DCP's CheckpointException is a BaseException
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise CheckpointError(
            f"checkpoint {step_dir} does not fit this model ({_first_line(exc)}); it was "
            "written for another architecture: compare the spec in its meta.json with "
            "the run's model settings"
        ) from exc
    return planner.missing


def _first_line(exc: BaseException) -> str:
    """The root message of ``exc`` (a DCP CheckpointException: its first rank's)."""
    failures = getattr(exc, "failures", None)
    if failures:
        exc = failures[min(failures)]
        exc = exc[0] if isinstance(exc, tuple) else exc
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def prune_run(path: str | Path, roles: Sequence[str], keep: int) -> list[Path]:
    """Keep the newest ``keep`` iterations that every role under ``path`` saved, and what
    is newer; delete every role's older step folders. Returns what was deleted.

    Retention is decided over the roles together, never per role: when one role's part of
    a checkpoint could not be written, the other roles' older steps are the only ones a
    resume can pair it with (:func:`resolve_run` matches roles by iteration, since their
    step numbers differ), so a role pruning alone could leave no iteration they share."""
    path = Path(path)
    saved = {
        role: [(_next_iteration(step), step) for step in step_dirs(path / role)] for role in roles
    }
    common = set.intersection(*({i for i, _ in steps} for steps in saved.values())) - {None}
    if len(common) <= keep:
        return []
    oldest_kept = sorted(common)[-max(keep, 1)]
    gone = [s for steps in saved.values() for i, s in steps if i is not None and i < oldest_kept]
    for step in gone:
        shutil.rmtree(step, ignore_errors=True)
    return gone


def withdraw(root: str | Path, name: str) -> None:
    """Unpublish step folder ``name`` under ``root``: another role's part of the same
    checkpoint could not be written, and a resume must find every role at one step.
    ``latest`` goes back to the newest complete step before it (or away, if none)."""
    root = Path(root)
    step = root / name
    if latest_dir(root) == step:
        previous = [p for p in step_dirs(root) if p < step]
        if previous:
            _write_latest(root, previous[-1].name)
        else:
            (root / LATEST).unlink(missing_ok=True)
    shutil.rmtree(step, ignore_errors=True)


def _write_latest(root: Path, name: str) -> None:
    tmp = root / f"{LATEST}.tmp"
    tmp.write_text(name + "\n")
    os.replace(tmp, root / LATEST)


# ---- finding and checking ------------------------------------------------------------------
def step_dirs(root: str | Path) -> list[Path]:
    """The ``step_*`` folders under ``root`` that were published (not ``.tmp``), oldest first."""
    return sorted(
        p for p in Path(root).glob("step_*") if p.is_dir() and not p.name.endswith(".tmp")
    )


def latest_dir(root: str | Path) -> Path | None:
    """The newest complete checkpoint directory under ``root``, or ``None``."""
    pointer = Path(root) / LATEST
    if not pointer.exists():
        return None
    return Path(root) / pointer.read_text().strip()


def problem_of(step_dir: Path) -> str | None:
    """Why ``step_dir`` cannot be resumed (naming the file), or None when it is complete.

    Checks the manifest: every file present at its recorded size, each safetensors
    header and each JSON file readable. (A flipped bit inside tensor data is not seen.)
    """
    meta_file = step_dir / META
    try:
        meta = json.loads(meta_file.read_text())
    except FileNotFoundError:
        return f"{meta_file} is missing"
    except (OSError, ValueError) as exc:
        return f"{meta_file} is unreadable ({exc})"
    if meta.get("format") not in READABLE_FORMATS:
        return (
            f"{meta_file}: format {meta.get('format')}, this version reads formats "
            f"{', '.join(map(str, READABLE_FORMATS))}"
        )
    for name, size in meta["files"].items():
        file = step_dir / name
        if not file.is_file():
            return f"{file} is missing"
        if file.stat().st_size != size:
            return f"{file} has {file.stat().st_size} bytes, {size} were written"
        if problem := _unreadable(file):
            return f"{file} is unreadable ({problem})"
    return None


def _unreadable(file: Path) -> str | None:
    try:
        if file.suffix == ".safetensors":
            with safe_open(str(file), framework="pt") as handle:
                handle.keys()
        elif file.suffix == ".json":
            json.loads(file.read_text())
    except Exception as exc:  # any parser's complaint: the file is not what was written
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None


def resolve(path: str | Path, role: str | None = None) -> Path:
    """The step folder a path names: a step folder itself, a role's folder (its latest),
    or a run's checkpoints folder (``role``'s latest).

    Raises:
        CheckpointError: nothing to resume there, or a corrupt checkpoint (naming the
            file and the previous complete step).
    """
    path = Path(path)
    if (path / META).exists() or path.name.startswith("step_"):
        step_dir = path
    else:
        folder = path / role if role is not None and (path / role).is_dir() else path
        step_dir = latest_dir(folder)
        if step_dir is None:
            raise CheckpointError(
                f"no '{LATEST}' file under {folder}: nothing to resume from "
                "(pass a step folder, e.g. checkpoints/actor/step_00000012)"
            )
    problem = problem_of(step_dir)
    if problem is not None:
        previous = [p for p in step_dirs(step_dir.parent) if p < step_dir and not problem_of(p)]
        hint = (
            f"the previous complete step is {previous[-1]}: resume from it with "
            f"--resume-from {previous[-1]}"
            if previous
            else "no earlier complete step is left under it"
        )
        raise CheckpointError(f"checkpoint {step_dir} is corrupt: {problem}; {hint}")
    return step_dir


def resolve_run(path: str | Path, roles: list[str]) -> dict[str, Path]:
    """Each trained role's step folder for a run's checkpoint named by ``path``: the run's
    checkpoints folder (every role's latest; where a failure between two roles' saves left
    them at different iterations, the newest iteration all of them saved) or one role's
    step folder (that step of every role, e.g. ``checkpoints/actor/step_00000012``).

    Raises:
        CheckpointError: a role with nothing to resume, or a corrupt step (naming it).
    """
    path = Path(path)
    if path.name.startswith("step_") and path.parent.name in roles:
        return {role: resolve(path.parent.parent / role / path.name) for role in roles}
    latest = {role: resolve(path / role) for role in roles}
    if len({_next_iteration(step) for step in latest.values()}) <= 1:
        return latest
    # A run that failed between two roles' saves: the newest iteration every role saved.
    saved = {
        role: {_next_iteration(s): s for s in step_dirs(path / role) if not problem_of(s)}
        for role in roles
    }
    common = set.intersection(*(set(steps) for steps in saved.values())) - {None}
    if not common:
        return latest  # the caller names the disagreement
    return {role: saved[role][max(common)] for role in roles}


def _next_iteration(step_dir: Path) -> int | None:
    """The run's next iteration recorded in ``step_dir`` (roles' step numbers differ when
    their optimizer steps per iteration do, so the iteration is what they share)."""
    try:
        position = json.loads((step_dir / META).read_text()).get("data_position")
    except (OSError, ValueError):
        return None
    return position.get("next_iteration") if isinstance(position, dict) else None


class Checkpoint:
    """A verified step folder, read piece by piece."""

    def __init__(self, step_dir: Path) -> None:
        self.dir = step_dir
        self.meta: dict[str, Any] = decode(json.loads((step_dir / META).read_text()), {})

    @property
    def format(self) -> int:
        return self.meta["format"]

    def weights(self, meta: bool = False) -> Mapping[str, torch.Tensor]:
        """Every weight, full, by canonical name, each read when asked (``meta``: meta
        tensors, no bytes read); one process, no process group."""
        if self.format == LEGACY_FORMAT:
            return FileTensors(self.dir / "model.safetensors", meta)
        return FullTensors(self.dir / SHARDS, MODEL, meta)

    @property
    def base_dir(self) -> Path | None:
        """Where a LoRA step's frozen base lies: the run's ``base/`` (:func:`save_base`),
        the step folder itself (LoRA steps written before they left the base out), or
        ``None``: a full-weight step, or a base loaded from its origin (``meta["base"]``).

        Raises:
            CheckpointError: the ``base/`` it names is missing or incomplete.
        """
        if self.meta.get("lora") is None:
            return None
        if "base_weights" not in self.meta:
            return self.dir
        name = self.meta["base_weights"]
        if name is None:
            return None
        base = self.dir.parent / name
        problem = problem_of(base)
        if problem is not None:
            raise CheckpointError(
                f"checkpoint {self.dir} keeps its frozen base in {base}, which cannot be "
                f"read ({problem}); copy that folder beside the step folder"
            )
        return base

    def base_weights(self, meta: bool = False) -> Mapping[str, torch.Tensor] | None:
        """The frozen base's full weights by canonical name, read when asked (see
        :attr:`base_dir`); ``None`` where the base is its origin's."""
        base = self.base_dir
        return None if base is None else FullTensors(base / SHARDS, MODEL, meta)

    def load(self, name: str) -> Any:
        return load_tree(self.dir / name)

    def load_rank(self, kind: str, rank: int) -> Any | None:
        stem = rank_stem(self.dir, kind, rank)
        return load_tree(stem) if stem.with_suffix(".json").exists() else None


def open_checkpoint(path: str | Path, role: str | None = None) -> Checkpoint:
    """:func:`resolve` + read its ``meta.json``."""
    return Checkpoint(resolve(path, role))
