"""Megatron-core training engine: dense and MoE GPTs, RL forward passes, train step.

Entry points:
    :class:`GPTSpec`, :class:`ParallelSpec`, :class:`OptimSpec`: what to build.
    :class:`MegatronEngine`: build, ``forward`` (log-probs / entropy / values),
        ``train_step``, HF weights in/out, checkpoints.
    :class:`ResponseBatch`: what ``forward`` / ``train_step`` take (packed rows and their
        response span); their outputs are response-aligned ``[B, R]``.
    :class:`MicroBatching`: how they cut it (rows, or a token budget per micro-batch).
    :func:`param_layouts`: canonical name -> ``ParamLayout`` for the resharder.
    ``families.get_family(name).megatron_to_hf(full, spec)``: full Megatron tensors -> HF.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Name -> the module defining it, imported on first use: the model families' registry
#: (``families``, which the config's ``model.family`` choices read) and the specs load
#: without the engine's torch.distributed stack.
_EXPORTS = {
    "GPTSpec": "backends.megatron.spec",
    "GlobalCounts": "backends.megatron.batch",
    "MegatronEngine": "backends.megatron.engine",
    "MicroBatching": "backends.megatron.batch",
    "OptimSpec": "backends.megatron.optim",
    "ParallelSpec": "backends.megatron.spec",
    "ResponseBatch": "backends.megatron.batch",
    "param_layouts": "backends.megatron.layouts",
}
__all__ = [
    "GPTSpec",
    "GlobalCounts",
    "MegatronEngine",
    "MicroBatching",
    "OptimSpec",
    "ParallelSpec",
    "ResponseBatch",
    "param_layouts",
]

if TYPE_CHECKING:
    from backends.megatron.batch import GlobalCounts, MicroBatching, ResponseBatch
    from backends.megatron.engine import MegatronEngine
    from backends.megatron.layouts import param_layouts
    from backends.megatron.optim import OptimSpec
    from backends.megatron.spec import GPTSpec, ParallelSpec


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'backends.megatron' has no attribute '{name}'")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
