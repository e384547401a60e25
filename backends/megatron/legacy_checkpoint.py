"""Format-2 checkpoints, written before sharded checkpoints, still load.

Format 2 keeps every weight full in ``model.safetensors`` under canonical names, a torch
AdamW's moments full in ``optimizer.safetensors`` (+ param groups and LR schedule in
``optimizer.json``) and a distributed optimizer's state as Megatron's DP-zero buffers per
rank in ``optimizer/rank_*`` (which only the layout that wrote them can read). Every rank
reads the full tensors and keeps its shard, as that format always did; the run's next
checkpoint is written sharded (format 3).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from backends.megatron import checkpoint
from backends.megatron.cpu_compat import megatron_compat
from backends.megatron.layouts import canonical_parameters, layout_of, tp_rank_for, tp_world_for
from backends.megatron.sharding import shard_tensor

#: A parameter whose saved state may be stored under another name (tied weights).
_TIED = {"output_layer.weight": "embedding.word_embeddings.weight"}


def load(engine, saved: checkpoint.Checkpoint) -> Any:
    """Resume ``engine`` (a ``MegatronEngine``) from format-2 step folder ``saved``;
    returns its data position.

    Raises:
        CheckpointError: a distributed optimizer's state at another layout, or the other
            optimizer (that format's state cannot be moved).
    """
    meta = saved.meta
    kind = engine.optimizer_kind()
    if engine.optimizer is not None and meta["optimizer"] != kind:
        raise checkpoint.CheckpointError(
            f"the format-2 checkpoint {saved.dir} was written with distributed_optimizer="
            f"{str(meta['optimizer'] == 'distributed').lower()} but this run has "
            f"{str(engine.distributed is not None).lower()}; resume with the same "
            "optim.distributed_optimizer setting"
        )
    same_layout = meta["layout"] == engine.layout()
    if engine.distributed is not None and not same_layout:
        raise checkpoint.CheckpointError(
            f"the format-2 checkpoint {saved.dir} holds a distributed optimizer's state at "
            f"layout {meta['layout']}, which only that layout resumes (this run: "
            f"{engine.layout()}); resume at the saved layout: its next checkpoint is "
            "sharded and resumes at any layout"
        )
    engine.load_full_state_dict(saved.load("model"))
    if engine.distributed is not None:
        with megatron_compat(engine.device):  # collective over DP
            engine.distributed.load_state_dict(saved.load_rank("optimizer", dist.get_rank()))
    elif engine.optimizer is not None:
        _load_adamw(engine, saved.load("optimizer"))
    if same_layout:
        checkpoint.restore_rng(saved.load_rank("rng", dist.get_rank()))
    engine.step = meta["step"]
    return meta["data_position"]


def _load_adamw(engine, saved: dict[str, Any]) -> None:
    """Slice the saved full AdamW state for this rank's layout and load it."""
    full = saved["state"]
    optimizer = engine.optimizer
    order = {id(p): i for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])}
    state = {}
    for name, param in canonical_parameters(engine.model).items():
        # Tied embeddings with PP > 1: the last stage's output layer is a copy of the
        # embedding (grads all-reduced), so its moments are the embedding's.
        source = full.get(name) or full.get(_TIED.get(name, ""))
        if not source:
            continue
        layout = layout_of(name, param)
        state[order[id(param)]] = {
            key: shard_tensor(value, layout, tp_rank_for(param), tp_world_for(param))
            if tuple(value.shape) == layout.full_shape and value.dim() > 0
            else value
            for key, value in source.items()
        }
    groups = []
    start = 0
    for group, saved_group in zip(optimizer.param_groups, saved["param_groups"], strict=True):
        ids = list(range(start, start + len(group["params"])))
        groups.append({**saved_group, "params": ids})
        start += len(ids)
    optimizer.load_state_dict({"state": state, "param_groups": groups})
    engine.scheduler.load_state_dict(saved["scheduler"])
    for param_state in optimizer.state.values():  # own, resizable storages (allgather-swap)
        for key, value in param_state.items():
            if torch.is_tensor(value):
                param_state[key] = value.clone()
