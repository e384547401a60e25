"""Atomic, layout-free checkpoints that hold tensors and plain data only.

Layout under ``root`` (one role's folder)::

    step_00000012/
        meta.json                   step, layout, optimizer kind, data position, manifest
        model.safetensors (+.json)  every parameter, full (unsharded), canonical names
        optimizer.safetensors/.json AdamW: full moments and steps per canonical name,
                                    param groups, LR schedule
        optimizer/rank_00000.*      distributed optimizer: Megatron's DP-zero state per rank
        rng/rank_00000.*            each rank's RNG streams
    latest                          text file naming the newest complete step folder

Full tensors under canonical names make a checkpoint independent of its TP / PP / EP /
DP layout: a resume slices them for its own layout (``sharding.shard_tensor``), as
weights loaded from HF are. Nothing is pickled: tensors go to safetensors, the rest to
JSON (:func:`encode`), so loading a tampered checkpoint cannot run code.

Saving: every rank writes into ``step_N.tmp``; after a barrier rank 0 writes
``meta.json`` with the size of every file, renames the folder to ``step_N`` and replaces
``latest`` through a temporary file and ``os.replace``. A crash at any point leaves
``latest`` naming the previous complete checkpoint. Loading checks the manifest first and
names a missing, truncated or unreadable file together with the previous complete step.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from safetensors import safe_open
from safetensors.torch import load_file, save_file

LATEST = "latest"
META = "meta.json"
FORMAT = 2  # 1: the per-rank pickled .pt files of earlier versions


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed: one line naming the file and what to do."""


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


def save(
    root: str | Path,
    step: int,
    shared: dict[str, Any],
    per_rank: dict[str, Any],
    meta: dict[str, Any],
    keep: int | None = None,
) -> Path:
    """Write a checkpoint for ``step`` and publish it as latest (collective).

    Args:
        shared: name -> tree written once, by rank 0 (every rank holds the same).
        per_rank: name -> this rank's tree (``None`` values are skipped).
        meta: plain data for ``meta.json`` (step, layout, data position, ...).
        keep: delete older complete checkpoints beyond the newest ``keep``.
    """
    root = Path(root)
    final = root / f"step_{step:08d}"
    tmp = root / f"step_{step:08d}.tmp"
    rank = dist.get_rank()
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name, tree in shared.items():
            save_tree(tmp / name, tree)
    dist.barrier()
    for kind, tree in per_rank.items():
        if tree is not None:
            save_tree(rank_stem(tmp, kind, rank), tree)
    dist.barrier()
    if rank == 0:
        files = {
            str(p.relative_to(tmp)): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()
        }
        record = {"format": FORMAT, **meta, "files": files}
        (tmp / META).write_text(json.dumps(encode(record, {}), indent=1))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        _write_latest(root, final.name)
        if keep is not None:
            prune(root, keep)
    dist.barrier()
    return final


def prune(root: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` complete ``step_*`` directories under ``root``."""
    steps = step_dirs(root)
    for old in steps[: max(len(steps) - max(keep, 1), 0)]:
        shutil.rmtree(old, ignore_errors=True)


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
    if meta.get("format") != FORMAT:
        return f"{meta_file}: format {meta.get('format')}, this version reads format {FORMAT}"
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
    checkpoints folder (every role's latest) or one role's step folder (that step of every
    role, e.g. ``checkpoints/actor/step_00000012``).

    Raises:
        CheckpointError: a role with nothing to resume, or a corrupt step (naming it).
    """
    path = Path(path)
    if path.name.startswith("step_") and path.parent.name in roles:
        return {role: resolve(path.parent.parent / role / path.name) for role in roles}
    return {role: resolve(path / role) for role in roles}


class Checkpoint:
    """A verified step folder, read piece by piece."""

    def __init__(self, step_dir: Path) -> None:
        self.dir = step_dir
        self.meta: dict[str, Any] = decode(json.loads((step_dir / META).read_text()), {})

    def load(self, name: str) -> Any:
        return load_tree(self.dir / name)

    def load_rank(self, kind: str, rank: int) -> Any | None:
        stem = rank_stem(self.dir, kind, rank)
        return load_tree(stem) if stem.with_suffix(".json").exists() else None


def open_checkpoint(path: str | Path, role: str | None = None) -> Checkpoint:
    """:func:`resolve` + read its ``meta.json``."""
    return Checkpoint(resolve(path, role))
