"""Distributed transfer dock (docs/architecture.md §4; paper "Distributed Transfer Dock Strategy").

Sample flow between RL stages without a central bottleneck:

* a **TD controller** per stage (``rollout``, ``reward``, ``ref_logp``, ``old_logp``,
  ``values``, ``advantage``, ``update``...) holds only metadata: per sample index, which
  fields are ready, in which warehouse, the sample's length, whether the stage consumed
  it (the controllers of the stages on one node share one process);
* a **TD warehouse** per node owns a contiguous, group-aligned share of the indexes and
  stores the payloads unpadded; after each put it broadcasts the new metadata to the
  controllers that track the put's fields;
* the **client** is all a worker or the driver touches. Payloads travel as numpy
  buffers between the client and the owning warehouse (zero-copy from the same-node
  object store), never through a controller or the driver.

Public API::

    create_dock(schema, stages, n_samples, group_size=1, warehouses=None,
                kind="distributed" | "central", timeout_s=120.0,
                controller_nodes=None, group_ids=None) -> DockHandle
    shutdown_dock(handle) -> None
    DockClient(handle)                                   # anywhere; the handle pickles
        .put(indexes, TensorDict | dict) -> None
        .get(stage, fields, batch_size, whole_groups=False, timeout_s=None)
            -> (indexes [n] int64 ndarray, TensorDict)
        .claim(stage, fields, batch_size, whole_groups=False, dp_parts=1, timeout_s=None)
            -> list[ndarray]                             # metadata only, one per DP rank
        .fetch(indexes, fields) -> TensorDict            # payloads only
        .recycle(indexes) -> None                        # free indexes for new samples
        .hold(indexes, held=True) -> None                # keep out of claims / give back
        .ready_count(stage, fields) -> int               # progress of a producer stage
        .clear() -> None                                 # between iterations
        .stats() -> {"endpoints": [...], "metadata_bytes": int, "client": {...}}
        .local_warehouse -> int | None
    snapshot_samples(client, [DockSlice(indexes, fields, version_stage)]) -> saved
    restore_samples(client, saved) -> int                # checkpoints: samples in flight

Usage::

    handle = create_dock(RL_FIELDS, ["rollout", "reward", "update"], n_samples=G * N,
                         group_size=N)                    # driver: starts the actors
    dock = DockClient(handle)                             # in any process
    dock.put(range(G * N), {"prompt_ids": prompts, "prompt_ids_lengths": lengths})
    idx, batch = dock.get("rollout", ["prompt_ids"], batch_size=64, whole_groups=True)
    parts = dock.claim("update", ["advantages"], 128, dp_parts=2)     # on the driver
    batch = dock.fetch(parts[rank], ["response_ids", "advantages"])   # on DP rank `rank`
    dock.clear()

A fetched variable-length field ``f`` comes right-padded with the field's pad value,
with ``f_lengths`` beside it (:func:`mindrl.dock.tensors.attention_mask` turns lengths
into a mask). Tensors are read-only views of Ray's object store: clone before in-place
writes.

``kind="central"`` builds the centralized replay buffer baseline behind the same client.
Every failure is a :class:`DockError` naming the stage, field or actor: a bad put
(unknown field, wrong dtype or shape) stores nothing; a dead warehouse or controller,
or a stage that waits past ``timeout_s``, fails instead of hanging.

The actors import numpy and Ray only (no torch), so each is a light process; importing
this package is lazy for the same reason.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "RL_FIELDS": "mindrl.dock.schema",
    "FieldSpec": "mindrl.dock.schema",
    "DockError": "mindrl.dock.errors",
    "DockHandle": "mindrl.dock.handle",
    "group_slots": "mindrl.dock.handle",
    "slot_indexes": "mindrl.dock.handle",
    "DockSlice": "mindrl.dock.snapshot",
    "snapshot_samples": "mindrl.dock.snapshot",
    "restore_samples": "mindrl.dock.snapshot",
    "DockClient": "mindrl.dock.client",
    "create_dock": "mindrl.dock.builder",
    "shutdown_dock": "mindrl.dock.builder",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    # Lazy: an actor process importing mindrl.dock.warehouse must not pull in torch.
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mindrl.dock' has no attribute '{name}'")
    return getattr(importlib.import_module(module), name)
