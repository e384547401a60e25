"""Distributed transfer dock (DESIGN.md §3; paper "Distributed Transfer Dock Strategy").

Sample flow between RL stages without a central bottleneck:

* a **TD controller** per stage (``rollout``, ``reward``, ``ref_logp``, ``old_logp``,
  ``values``, ``advantage``, ``update``...) holds only metadata: per sample index, which
  fields are ready, in which warehouse, the sample's length, whether the stage consumed
  it;
* a **TD warehouse** per node owns a contiguous, group-aligned share of the indexes and
  stores the payloads unpadded; after each put it broadcasts the new metadata to the
  controllers;
* the **client** is all a worker or the driver touches. Payloads travel as numpy
  buffers between the client and the owning warehouse (zero-copy from the same-node
  object store), never through a controller or the driver.

Usage::

    handle = create_dock(RL_FIELDS, ["rollout", "reward", "update"], n_samples=G * N,
                         group_size=N)                    # driver: starts the actors
    dock = DockClient(handle)                             # anywhere (handle pickles)
    dock.put(range(G * N), {"prompt_ids": prompts, "prompt_ids_lengths": lengths})
    idx, batch = dock.get("rollout", ["prompt_ids"], batch_size=64)   # TensorDict
    parts = dock.claim("update", ["advantages"], 128, dp_parts=2)     # metadata only
    batch = dock.fetch(parts[rank], ["response_ids", "advantages"])   # on the worker
    dock.clear()                                          # between iterations

``kind="central"`` builds the centralized replay buffer baseline behind the same client.
Every failure is a :class:`DockError` naming the stage or actor: a bad put (unknown
field, wrong dtype or shape) stores nothing; a dead warehouse or controller, or a stage
that waits past ``timeout_s``, fails instead of hanging.
"""

from mindrl.dock.builder import create_dock, shutdown_dock
from mindrl.dock.client import DockClient, DockHandle
from mindrl.dock.schema import RL_FIELDS, DockError, FieldSpec

__all__ = [
    "RL_FIELDS",
    "DockClient",
    "DockError",
    "DockHandle",
    "FieldSpec",
    "create_dock",
    "shutdown_dock",
]
