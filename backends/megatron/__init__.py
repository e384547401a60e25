"""Megatron-core training engine: dense and MoE GPTs, RL forward passes, train step.

Entry points:
    :class:`GPTSpec`, :class:`ParallelSpec`, :class:`OptimSpec`: what to build.
    :class:`MegatronEngine`: build, ``forward`` (log-probs / entropy / values),
        ``train_step``, HF weights in/out, checkpoints.
    :class:`ResponseBatch`: what ``forward`` / ``train_step`` take (packed rows and their
        response span); their outputs are response-aligned ``[B, R]``.
    :func:`param_layouts`: canonical name -> ``ParamLayout`` for the resharder.
    ``families.get_family(name).megatron_to_hf(full, spec)``: full Megatron tensors -> HF.
"""

from backends.megatron.batch import GlobalCounts, ResponseBatch
from backends.megatron.engine import MegatronEngine
from backends.megatron.layouts import param_layouts
from backends.megatron.optim import OptimSpec
from backends.megatron.spec import GPTSpec, ParallelSpec

__all__ = [
    "GPTSpec",
    "GlobalCounts",
    "MegatronEngine",
    "OptimSpec",
    "ParallelSpec",
    "ResponseBatch",
    "param_layouts",
]
