"""Layout facts of every parameter (:class:`backends.layout.ParamLayout`) under canonical names.

Canonical names are the local-spec names with *global* layer and expert indexes, so the
same name means the same tensor on every rank and at every layout:
``decoder.layers.{global_layer}...mlp.experts.local_experts.{global_expert}...``.

Megatron's own tags decide the kind: ``tensor_model_parallel`` + ``partition_dim`` 0 is
column (vocab for the embedding and output layer), 1 is row, untagged is replicated;
``partition_stride`` 2 is the fused SwiGLU ``[gate; up]`` (``fused_pieces=2``).
The qkv weight is group-interleaved (see ``families/base.py``), so a contiguous split by
query groups is a correct TP split and it keeps ``fused_pieces=1``.
Expert parameters are split over expert-tensor-parallel ranks, the rest over TP ranks.

Models built with the TransformerEngine layer spec (GPUs) name two norms differently and
add ``_extra_state`` entries to their state dicts; :func:`local_spec_name` maps the norms
back and :func:`is_extra_state` spots the entries, so canonical names are spec-independent.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from backends.layout import ParamLayout

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")
_EXPERT = re.compile(r"\.local_experts\.(\d+)\.")
VOCAB_PARAMS = ("embedding.word_embeddings.weight", "output_layer.weight")

# megatron-core's TE spec (get_gpt_layer_with_transformer_engine_spec) builds linear_qkv
# and, in dense layers, linear_fc1 as TELayerNormColumnParallelLinear: the input and
# pre-MLP norms live there as layer_norm_weight (+ layer_norm_bias for LayerNorm). MoE
# layers keep pre_mlp_layernorm. The local spec's sharded_state_dict_keys_map says the same.
_TE_FUSED_NORMS = (
    (
        re.compile(r"(layers\.\d+\.)self_attention\.linear_qkv\.layer_norm_(weight|bias)$"),
        r"\1input_layernorm.\2",
    ),
    (
        re.compile(r"(layers\.\d+\.)mlp\.linear_fc1\.layer_norm_(weight|bias)$"),
        r"\1pre_mlp_layernorm.\2",
    ),
    # MLA (TE spec): the q / kv latent norms live in the up projections.
    (
        re.compile(r"(self_attention\.)linear_q_up_proj\.layer_norm_(weight|bias)$"),
        r"\1q_layernorm.\2",
    ),
    (
        re.compile(r"(self_attention\.)linear_kv_up_proj\.layer_norm_(weight|bias)$"),
        r"\1kv_layernorm.\2",
    ),
)
EXTRA_STATE = "_extra_state"


def local_spec_name(name: str) -> str:
    """The local-spec name of a TE-spec parameter name (other names are returned as is)."""
    if ".layer_norm_" not in name:  # fast path: conversion renames every weight sync
        return name
    for pattern, local in _TE_FUSED_NORMS:
        name = pattern.sub(local, name)
    return name


def is_extra_state(name: str) -> bool:
    """A TE module's ``_extra_state`` state-dict entry (FP8 metadata, not a weight)."""
    return EXTRA_STATE in name and name.rsplit(".", 1)[-1].startswith(EXTRA_STATE)


def local_spec_state_dict(state: dict) -> dict:
    """``state`` under local-spec names, ``_extra_state`` entries dropped (no tensor copies).

    Raises:
        ValueError: two keys map to the same name (a state dict mixing both specs).
    """
    out = {}
    for name, value in state.items():
        if is_extra_state(name):
            continue
        local = local_spec_name(name)
        if local in out:
            raise ValueError(f"'{name}' and another key both map to '{local}'")
        out[local] = value
    return out


def _layer_offset(model: nn.Module) -> int:
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    return get_transformer_layer_offset(model.config)


def _expert_offset(model: nn.Module) -> int:
    from megatron.core import parallel_state

    experts = model.config.num_moe_experts or 0
    ep = parallel_state.get_expert_model_parallel_world_size()
    return parallel_state.get_expert_model_parallel_rank() * (experts // ep)


def canonical_name(local_name: str, layer_offset: int, expert_offset: int) -> str:
    """This rank's parameter name (local or TE spec) -> canonical name (local-spec names,
    global layer and expert indexes)."""
    name = local_spec_name(local_name)
    name = _LAYER.sub(lambda m: f"decoder.layers.{int(m.group(1)) + layer_offset}.", name)
    return _EXPERT.sub(lambda m: f".local_experts.{int(m.group(1)) + expert_offset}.", name)


#: Buffers that are weights: DeepSeek's router expert bias (HF ``e_score_correction_bias``)
#: and a VLA policy's state normalisation (``families/vla.py``).
WEIGHT_BUFFERS = ("mlp.router.expert_bias", "vla.state_centre", "vla.state_half_range")


def canonical_parameters(model: nn.Module) -> dict[str, nn.Parameter | torch.Tensor]:
    """This rank's parameters keyed by canonical name, and its :data:`WEIGHT_BUFFERS`.

    The router's expert bias is a buffer, full on every rank and not trained in RL (see
    ``builder.deepseek_routing``), yet the policy routes with it: it is loaded, gathered
    and resharded like a replicated parameter (it has no grad, so optimizers skip it).
    """
    layer_offset, expert_offset = _layer_offset(model), _expert_offset(model)
    weights = dict(model.named_parameters())
    weights |= {
        name: buffer
        for name, buffer in model.named_buffers()
        if buffer is not None and name.endswith(WEIGHT_BUFFERS)
    }
    return {
        canonical_name(name, layer_offset, expert_offset): tensor
        for name, tensor in weights.items()
    }


EXPERT_TAG = "is_routed_expert"


def tag_expert_params(model: nn.Module) -> None:
    """Mark routed-expert parameters (Megatron only tags them when EP > 1)."""
    for name, param in model.named_parameters():
        setattr(param, EXPERT_TAG, ".local_experts." in name)


def is_expert_param(param: nn.Parameter) -> bool:
    """Routed-expert weights: split over ETP, reduced over expert-DP (see tag_expert_params)."""
    return getattr(param, EXPERT_TAG, False)


def tp_world_for(param: nn.Parameter) -> int:
    """Size of the group ``param`` is tensor-split over (ETP for experts, else TP)."""
    from megatron.core import parallel_state

    if is_expert_param(param):
        return parallel_state.get_expert_tensor_parallel_world_size()
    return parallel_state.get_tensor_model_parallel_world_size()


def tp_rank_for(param: nn.Parameter) -> int:
    from megatron.core import parallel_state

    if is_expert_param(param):
        return parallel_state.get_expert_tensor_parallel_rank()
    return parallel_state.get_tensor_model_parallel_rank()


def layout_of(name: str, param: nn.Parameter) -> ParamLayout:
    """The :class:`ParamLayout` of one parameter given its canonical ``name``."""
    expert = _EXPERT.search(name)
    expert_index = int(expert.group(1)) if expert else None
    if not getattr(param, "tensor_model_parallel", False):
        return ParamLayout("replicated", tuple(param.shape), expert_index=expert_index)
    dim = param.partition_dim
    full_shape = list(param.shape)
    full_shape[dim] *= tp_world_for(param)
    kind = "vocab" if name in VOCAB_PARAMS else "column" if dim == 0 else "row"
    pieces = getattr(param, "partition_stride", 1)
    return ParamLayout(kind, tuple(full_shape), fused_pieces=pieces, expert_index=expert_index)


def param_layouts(model: nn.Module) -> dict[str, ParamLayout]:
    """Canonical name -> :class:`ParamLayout` for every parameter on this rank."""
    return {name: layout_of(name, p) for name, p in canonical_parameters(model).items()}
