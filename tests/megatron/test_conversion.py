"""HF <-> Megatron conversion is exact; qkv and gate/up layouts split by TP rank as claimed."""

from __future__ import annotations

import dataclasses

import torch

from backends.generation.hf_experts import unfuse_experts
from backends.layout import ParamLayout
from backends.megatron import GPTSpec
from backends.megatron.families import family_for_architecture
from backends.megatron.families.base import interleave_qkv
from backends.megatron.sharding import shard_tensor, unshard_tensors


def tiny_hf_model(kind: str):
    import transformers

    common = dict(
        vocab_size=90,  # not a multiple of TP=4: exercises vocab padding
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    if kind == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    config = transformers.Qwen3MoeConfig(
        **common,
        head_dim=16,
        moe_intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        mlp_only_layers=[0],
    )
    return transformers.Qwen3MoeForCausalLM(config)


def round_trip(kind: str) -> None:
    model = tiny_hf_model(kind)
    hf = unfuse_experts(dict(model.state_dict()))
    family = family_for_architecture(type(model).__name__)
    spec = family.spec_from_hf_config(model.config.to_dict())
    full = family.hf_to_megatron(hf, spec, tp=4)
    assert full["embedding.word_embeddings.weight"].shape == (92, 64)  # padded to TP=4
    back = family.megatron_to_hf(full, spec)
    assert back.keys() == hf.keys()
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name


def test_qwen2_hf_to_megatron_to_hf_is_exact():
    round_trip("qwen2")


def test_qwen3_moe_hf_to_megatron_to_hf_is_exact_and_reads_the_architecture():
    round_trip("qwen3_moe")
    spec = family_for_architecture("Qwen3MoeForCausalLM").spec_from_hf_config(
        tiny_hf_model("qwen3_moe").config.to_dict()
    )
    assert (spec.num_experts, spec.moe_router_topk, spec.moe_layers) == (4, 2, (1,))
    assert spec.qk_layernorm and spec.head_dim == 16


def test_a_contiguous_tp_split_of_fused_qkv_is_each_ranks_own_query_groups():
    spec = GPTSpec(num_attention_heads=8, num_query_groups=4, hidden_size=64)
    d, tp = spec.head_dim, 2
    q, k, v = torch.randn(8 * d, 64), torch.randn(4 * d, 64), torch.randn(4 * d, 64)
    layout = ParamLayout("column", (16 * d, 64))
    rank_spec = GPTSpec(num_attention_heads=4, num_query_groups=2, hidden_size=64, head_dim=d)
    shards = []
    for rank in range(tp):
        shard = shard_tensor(interleave_qkv(q, k, v, spec), layout, rank, tp)
        heads = [t.chunk(tp)[rank] for t in (q, k, v)]
        assert torch.equal(shard, interleave_qkv(*heads, rank_spec))
        shards.append(shard)
    assert torch.equal(unshard_tensors(shards, layout), interleave_qkv(q, k, v, spec))


def test_fused_gate_up_pieces_are_split_one_by_one():
    gate, up = torch.randn(8, 3), torch.randn(8, 3)
    layout = ParamLayout("column", (16, 3), fused_pieces=2)
    shard = shard_tensor(torch.cat([gate, up]), layout, 1, 2)
    assert torch.equal(shard, torch.cat([gate[4:], up[4:]]))
    shards = [shard_tensor(torch.cat([gate, up]), layout, r, 2) for r in range(2)]
    assert torch.equal(unshard_tensors(shards, layout), torch.cat([gate, up]))


def test_deepseek_v3_hf_to_megatron_to_hf_is_exact_for_low_rank_and_full_queries():
    from tests.megatron import deepseek_cases as ds

    for q_lora_rank in ds.Q_LORA.values():
        model = ds.tiny_model(q_lora_rank)
        hf = ds.hf_state(model)
        spec = ds.FAMILY.spec_from_hf_config(model.config.to_dict())
        full = ds.FAMILY.hf_to_megatron(hf, spec, tp=4)
        assert full["decoder.layers.1.mlp.router.expert_bias"].abs().sum() > 0
        assert "decoder.layers.0.mlp.router.weight" not in full  # the first layer is dense
        back = ds.FAMILY.megatron_to_hf(full, spec)
        assert back.keys() == hf.keys()
        for name, tensor in hf.items():
            assert torch.equal(back[name], tensor), name


def test_deepseek_v3_reads_mla_routing_and_yarn_from_the_hf_config():
    from tests.megatron import deepseek_cases as ds

    spec = ds.FAMILY.spec_from_hf_config(ds.tiny_config().to_dict())
    assert (spec.q_lora_rank, spec.kv_lora_rank, spec.qk_rope_head_dim) == (32, 30, 8)
    assert (spec.num_experts, spec.moe_router_topk, spec.moe_layers) == (8, 4, (1, 2))
    assert (spec.moe_router_num_groups, spec.moe_router_group_topk) == (4, 2)
    assert spec.moe_router_score_function == "sigmoid" and spec.moe_router_expert_bias
    assert spec.moe_router_topk_scaling_factor == 2.5 and spec.moe_shared_expert_size == 32
    assert spec.yarn == (4.0, 64, 32.0, 1.0, 1.0, 1.0)


def test_deepseek_v3_multi_token_prediction_weights_skip_the_engine_and_return_on_export():
    from tests.megatron import deepseek_cases as ds

    model = ds.tiny_model()
    hf = ds.hf_state(model)
    spec = ds.FAMILY.spec_from_hf_config(model.config.to_dict())
    mtp = {"model.layers.3.eh_proj.weight": torch.randn(64, 128)}  # a checkpoint's MTP layer
    full = ds.FAMILY.hf_to_megatron(hf | mtp, spec)
    assert not any(name.startswith("decoder.layers.3.") for name in full)
    exported = ds.FAMILY.megatron_to_hf(full, spec) | ds.FAMILY.untrained_hf_tensors(hf | mtp, spec)
    assert exported.keys() == (hf | mtp).keys()
    assert torch.equal(
        exported["model.layers.3.eh_proj.weight"], mtp["model.layers.3.eh_proj.weight"]
    )


def test_a_deepseek_v3_checkpoint_the_engine_cannot_build_is_refused_naming_the_field():
    import pytest

    from tests.megatron import deepseek_cases as ds

    cases = {
        "rope_parameters.rope_type='llama3'": {
            "rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}
        },
        "norm_topk_prob=false": {"norm_topk_prob": False},
        "rope_interleave=false": {"rope_interleave": False},
        "num_experts_per_tok / topk_group": {"num_experts_per_tok": 6},
    }
    for field, change in cases.items():
        config = ds.tiny_config().to_dict() | change
        with pytest.raises(ValueError, match=field.replace("(", r"\(").replace(".", r"\.")) as err:
            ds.FAMILY.spec_from_hf_config(config)
        assert "\n" not in str(err.value)


def test_the_per_head_width_has_one_name_and_old_checkpoint_metas_still_load():
    derived = GPTSpec(num_attention_heads=4, hidden_size=64)
    assert derived.head_dim == 16  # resolved when the spec is made
    assert GPTSpec.from_dict(dataclasses.asdict(derived)) == derived
    # A checkpoint's meta from before the rename calls it kv_channels.
    old = {**dataclasses.asdict(derived), "head_dim": None}
    old["kv_channels"] = old.pop("head_dim")
    assert GPTSpec.from_dict(old | {"kv_channels": 32}).head_dim == 32
    assert GPTSpec.from_dict(old).head_dim == 16
