"""Megatron-core training engine: dense and MoE GPTs, RL forward passes, train step.

Entry points:
    :class:`GPTSpec`, :class:`ParallelSpec`, :class:`OptimSpec`: what to build.
    :class:`MegatronEngine`: build, ``forward`` (log-probs / entropy / values),
        ``train_step``, HF weights in/out, checkpoints.
    :func:`param_layouts`: canonical name -> ``ParamLayout`` for the resharder.
    ``families.get_family(name).megatron_to_hf(full, spec)``: full Megatron tensors -> HF.
"""

from backends.megatron.engine import MegatronEngine
from backends.megatron.layouts import param_layouts
from backends.megatron.optim import OptimSpec
from backends.megatron.spec import GPTSpec, ParallelSpec

__all__ = ["GPTSpec", "MegatronEngine", "OptimSpec", "ParallelSpec", "param_layouts"]
