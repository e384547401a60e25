"""Atomic, per-rank checkpoints: model shard, optimizer, scheduler, RNG, data position.

Layout under ``root``::

    step_00000012/rank_00000.pt ...   one file per rank (its shards and its RNG)
    latest                            text file naming the newest complete step dir

Every rank writes into ``step_N.tmp``; after a barrier rank 0 renames it to ``step_N``
and replaces ``latest`` through a temporary file and ``os.replace``. A crash at any
point leaves ``latest`` naming the previous complete checkpoint.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

LATEST = "latest"


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


def _rank_file(step_dir: Path) -> Path:
    return step_dir / f"rank_{dist.get_rank():05d}.pt"


def save(
    root: str | Path, step: int, state: dict[str, Any], data_position: Any, keep: int | None = None
) -> Path:
    """Write this rank's ``state`` for ``step`` and publish it as latest (collective).

    With ``keep``, older complete checkpoints beyond the newest ``keep`` are deleted
    after the new one is published.
    """
    root = Path(root)
    final = root / f"step_{step:08d}"
    tmp = root / f"step_{step:08d}.tmp"
    if dist.get_rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    torch.save({**state, "data_position": data_position}, _rank_file(tmp))
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        _write_latest(root, final.name)
        if keep is not None:
            prune(root, keep)
    dist.barrier()
    return final


def prune(root: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` complete ``step_*`` directories under ``root``."""
    steps = sorted(p for p in root.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp"))
    for old in steps[: max(len(steps) - max(keep, 1), 0)]:
        shutil.rmtree(old, ignore_errors=True)


def _write_latest(root: Path, name: str) -> None:
    tmp = root / f"{LATEST}.tmp"
    tmp.write_text(name + "\n")
    os.replace(tmp, root / LATEST)


def latest_dir(root: str | Path) -> Path | None:
    """The newest complete checkpoint directory under ``root``, or ``None``."""
    pointer = Path(root) / LATEST
    if not pointer.exists():
        return None
    return Path(root) / pointer.read_text().strip()


def load_latest(root: str | Path) -> tuple[dict[str, Any], Any]:
    """This rank's state and the data position of the latest checkpoint under ``root``.

    Raises:
        FileNotFoundError: there is no complete checkpoint under ``root``.
    """
    step_dir = latest_dir(root)
    if step_dir is None:
        raise FileNotFoundError(f"no '{LATEST}' file under {root}: nothing to resume from")
    state = torch.load(_rank_file(step_dir), weights_only=False)
    return state, state.pop("data_position")
