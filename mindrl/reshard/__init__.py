"""Resharding flow: training layout (Megatron-core) -> generation shards (vLLM layout).

Public API:

* :class:`TrainLayout` (world, tp, pp, cp, ep, etp) and :class:`GenLayout` (world, tp,
  ep): rank numbering as Megatron-core's ``parallel_state`` (order ``tp-cp-ep-dp-pp``)
  and vLLM; :class:`ModelShape` and :func:`check_layout_pair` refuse impossible pairs
  with a one-line :class:`LayoutError` before any communication.
* :class:`AllgatherSwapResharder`: ``reshard()`` all-gathers the training shards
  bucket by bucket, copies this rank's generation shards out, swaps the training
  weights (+ grads / optimizer state via ``swap_extra``) to pinned host buffers
  allocated once, frees the gather buffer; ``swap_in()`` brings the training state
  back before the update.
* :class:`NaiveResharder`: the baseline (new generation buffers, training weights stay).
* ``Resharder.simulated(full, layouts, stage_of, train, gen, rank)``: one process plays
  one rank of a whole world (peers' shards cut from full host weights).

The benchmarks' and tests' synthetic model (``synthetic_weights``, ``stage_of``) lives in
``benchmarks/harness/synthetic_model.py``, beside its users.

Per iteration the actor worker does::

    gen_weights = resharder.reshard(gen_weights)   # after the update: gather, copy, swap out
    engine.load_weights(to_hf(gen_weights)); rollouts = engine.generate(...)
    resharder.swap_in()                             # before the rollout stage returns
    trainer.update(...)                             # training state is back in place
"""

from mindrl.reshard.allgather_swap import (
    AllgatherSwapResharder,
    grad_tensors,
)
from mindrl.reshard.layouts import (
    GenLayout,
    LayoutError,
    ModelShape,
    TrainLayout,
    check_layout_pair,
)
from mindrl.reshard.naive import NaiveResharder
from mindrl.reshard.resharder import BaseResharder, local_training_shards
from mindrl.reshard.swap import HostSwap
from mindrl.reshard.timeline import MemoryTimeline

__all__ = [
    "AllgatherSwapResharder",
    "BaseResharder",
    "GenLayout",
    "HostSwap",
    "LayoutError",
    "MemoryTimeline",
    "ModelShape",
    "NaiveResharder",
    "TrainLayout",
    "check_layout_pair",
    "grad_tensors",
    "local_training_shards",
]
