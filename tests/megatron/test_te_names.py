"""Models built with the TransformerEngine layer spec keep the canonical names and layouts.

TE is not installed on the CPU machine, so a real local-spec GPTModel is rebuilt into the
module tree the TE spec makes (megatron-core 0.16.1, ``get_gpt_layer_with_transformer_
engine_spec`` and ``extensions/transformer_engine.py``): the input norm moves into
``self_attention.linear_qkv`` as ``layer_norm_weight`` (TELayerNormColumnParallelLinear),
the pre-MLP norm of dense layers into ``mlp.linear_fc1`` (MoE layers keep
``pre_mlp_layernorm``), and TE modules add ``_extra_state`` to the state dict.
:func:`te_spec_names` lists those names as written in the sources, independently.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from backends.megatron import GPTSpec
from backends.megatron.layouts import (
    canonical_name,
    is_extra_state,
    local_spec_name,
    local_spec_state_dict,
)
from tests.megatron import cases
from tests.support.spawn import run_ranks


def te_spec_names(spec: GPTSpec) -> set[str]:
    """State-dict weight names of ``spec`` built with the TE spec (no ``_extra_state``)."""
    names = {"embedding.word_embeddings.weight", "decoder.final_layernorm.weight"}
    if not spec.tie_word_embeddings:
        names.add("output_layer.weight")
    for layer in range(spec.num_layers):
        attn = f"decoder.layers.{layer}.self_attention."
        names |= {attn + "linear_qkv.layer_norm_weight", attn + "linear_qkv.weight"}
        names.add(attn + "linear_proj.weight")
        if spec.add_qkv_bias:
            names.add(attn + "linear_qkv.bias")
        if spec.qk_layernorm:  # TENorm
            names |= {attn + "q_layernorm.weight", attn + "k_layernorm.weight"}
        mlp = f"decoder.layers.{layer}.mlp."
        if layer not in spec.moe_layer_indexes():
            names |= {mlp + "linear_fc1.layer_norm_weight", mlp + "linear_fc1.weight"}
            names.add(mlp + "linear_fc2.weight")
            continue
        names |= {f"decoder.layers.{layer}.pre_mlp_layernorm.weight", mlp + "router.weight"}
        experts = [f"experts.local_experts.{e}." for e in range(spec.num_experts)]
        for part in experts + (["shared_experts."] if spec.moe_shared_expert_size else []):
            names |= {mlp + part + "linear_fc1.weight", mlp + part + "linear_fc2.weight"}
    return names


def _with_extra_state(module: nn.Module) -> None:
    """Give ``module`` a TE-like ``_extra_state`` (TE keeps FP8 metadata there)."""

    class WithExtraState(type(module)):
        def get_extra_state(self):
            return torch.tensor([7], dtype=torch.uint8)

        def set_extra_state(self, state):
            pass

    module.__class__ = WithExtraState


def _fuse_norm(layer: nn.Module, norm: str, linear: nn.Module) -> None:
    linear.register_parameter("layer_norm_weight", getattr(layer, norm).weight)
    setattr(layer, norm, nn.Identity())


def rebuild_as_te_spec(model: nn.Module) -> None:
    """Move norms and add ``_extra_state`` where the TE spec has them (same Parameter objects)."""
    from megatron.core.transformer.moe.moe_layer import MoELayer

    for layer in model.decoder.layers:
        attn = layer.self_attention
        _fuse_norm(layer, "input_layernorm", attn.linear_qkv)
        te_modules = [attn.linear_qkv, attn.linear_proj, attn.core_attention]
        te_modules += [m for m in (attn.q_layernorm, attn.k_layernorm) if hasattr(m, "weight")]
        if isinstance(layer.mlp, MoELayer):
            te_modules.append(layer.pre_mlp_layernorm)
            experts = list(layer.mlp.experts.local_experts)
            experts += [layer.mlp.shared_experts] if layer.mlp.shared_experts else []
            te_modules += [linear for e in experts for linear in (e.linear_fc1, e.linear_fc2)]
        else:
            _fuse_norm(layer, "pre_mlp_layernorm", layer.mlp.linear_fc1)
            te_modules += [layer.mlp.linear_fc1, layer.mlp.linear_fc2]
        for module in te_modules:
            _with_extra_state(module)
    _with_extra_state(model.decoder.final_layernorm)


def local_and_te_views(rank: int, world: int) -> dict:
    """Names, layouts and HF round trips of one model, before and after the TE rebuild."""
    from backends.megatron import MegatronEngine, ParallelSpec
    from backends.megatron.builder import destroy_parallel
    from backends.megatron.families import get_family
    from backends.megatron.layouts import canonical_parameters, param_layouts
    from backends.megatron.sharding import gather_full_state_dict, load_full_state_dict

    out = {}
    for key, spec in (("dense", cases.DENSE), ("moe", cases.MOE)):
        engine = MegatronEngine(spec, ParallelSpec())
        family = get_family(spec.family)
        model = engine.model
        hf = family.megatron_to_hf(cases.named_weights(engine.param_layouts()), spec)
        ids = {name: id(p) for name, p in canonical_parameters(model).items()}
        local = {"ids": ids, "layouts": param_layouts(model)}
        rebuild_as_te_spec(model)
        with torch.no_grad():
            for param in model.parameters():
                param.zero_()
        load_full_state_dict(model, family.hf_to_megatron(hf, spec))
        state = model.state_dict()
        out[key] = {
            "spec": spec,
            "hf": hf,
            "te_state_keys": set(state),
            "same_params": {n: id(p) for n, p in canonical_parameters(model).items()}
            == local["ids"],
            "te_layouts": param_layouts(model),
            "local_layouts": local["layouts"],
            "hf_from_gathered": family.megatron_to_hf(gather_full_state_dict(model), spec),
            "hf_from_state_dict": family.megatron_to_hf(state, spec),
        }
        destroy_parallel()
    return out


@pytest.fixture(scope="module")
def views():
    (result,) = run_ranks(local_and_te_views, 1)
    return result


@pytest.mark.parametrize("key", ["dense", "moe"])
def test_the_rebuilt_model_has_exactly_the_te_spec_names_plus_extra_state(views, key):
    view = views[key]
    weights = {n for n in view["te_state_keys"] if not is_extra_state(n)}
    assert weights == te_spec_names(view["spec"])
    assert "decoder.layers.0.self_attention.linear_qkv._extra_state" in view["te_state_keys"]


@pytest.mark.parametrize("key", ["dense", "moe"])
def test_te_spec_parameters_get_the_local_spec_canonical_names_and_layouts(views, key):
    view = views[key]
    assert view["same_params"]
    assert view["te_layouts"] == view["local_layouts"]


@pytest.mark.parametrize("key", ["dense", "moe"])
@pytest.mark.parametrize("source", ["hf_from_gathered", "hf_from_state_dict"])
def test_hf_round_trip_through_a_te_spec_model_is_exact(views, key, source):
    hf, back = views[key]["hf"], views[key][source]
    assert back.keys() == hf.keys()
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name


@pytest.mark.parametrize(
    ("te_name", "offsets", "canonical"),
    [
        (
            "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight",
            (2, 0),
            "decoder.layers.2.input_layernorm.weight",
        ),
        (
            "decoder.layers.1.self_attention.linear_qkv.layer_norm_bias",
            (0, 0),
            "decoder.layers.1.input_layernorm.bias",
        ),
        (
            "decoder.layers.0.mlp.linear_fc1.layer_norm_weight",
            (3, 0),
            "decoder.layers.3.pre_mlp_layernorm.weight",
        ),
        (
            "decoder.layers.1.mlp.experts.local_experts.1.linear_fc1.weight",
            (2, 4),
            "decoder.layers.3.mlp.experts.local_experts.5.linear_fc1.weight",
        ),
        (
            "decoder.layers.0.mlp.shared_experts.linear_fc1.weight",
            (0, 0),
            "decoder.layers.0.mlp.shared_experts.linear_fc1.weight",
        ),
        (
            "decoder.layers.0.self_attention.linear_qkv.weight",
            (1, 0),
            "decoder.layers.1.self_attention.linear_qkv.weight",
        ),
    ],
)
def test_canonical_name_maps_te_names_with_global_indexes(te_name, offsets, canonical):
    assert canonical_name(te_name, *offsets) == canonical
    assert local_spec_name(canonical) == canonical  # local-spec names are left alone


def test_extra_state_is_dropped_and_mixed_spec_state_dicts_are_refused():
    assert is_extra_state("decoder.layers.0.mlp.linear_fc1._extra_state")
    assert not is_extra_state("decoder.layers.0.mlp.linear_fc1.weight")
    state = {
        "decoder.layers.0.mlp.linear_fc1.layer_norm_weight": 1,
        "decoder.layers.0.mlp.linear_fc1._extra_state": 2,
    }
    assert local_spec_state_dict(state) == {"decoder.layers.0.pre_mlp_layernorm.weight": 1}
    with pytest.raises(ValueError, match="pre_mlp_layernorm"):
        local_spec_state_dict({**state, "decoder.layers.0.pre_mlp_layernorm.weight": 3})
