"""From the run's ``model`` config to what the engines build: a GPTSpec, an HF config,
and the initial weights (random, an HF folder, or a GGUF file shipped in a package).

Every role (actor, reference, critic, rollout) starts from the same initial weights, so
they are made once per process from the same seed and source; nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from backends.megatron import GPTSpec
from backends.megatron.families import family_for_architecture, get_family
from mindrl.config.schema import ModelConfig

#: transformers ``model_type`` of each family file the pipeline can build.
HF_MODEL_TYPES = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3_moe",
    "deepseek_v3": "deepseek_v3",
}


class ModelSetupError(ValueError):
    """The model section cannot be built by the pipeline; the message names the fix."""


@dataclass
class InitialModel:
    """What every role builds from.

    Attributes:
        spec: the architecture the Megatron engines build.
        hf_config: an HF ``config.json`` dictionary of the same model (generation engines).
        hf_state: full HF-named tensors to load, or ``None`` for the seeded random init.
    """

    spec: GPTSpec
    hf_config: dict
    hf_state: dict[str, torch.Tensor] | None


def gpt_spec(model: ModelConfig) -> GPTSpec:
    """The engine's :class:`GPTSpec` for a ``model`` section built from scratch."""
    if model.family == "deepseek_v3":
        # One reading of DeepSeek's options: the family's, from the HF config.
        return _spec_from_checkpoint_config(deepseek_v3_hf_config(model), model)
    if model.uses_mla:
        raise ModelSetupError(
            f"model.kv_lora_rank (MLA) is built by the deepseek_v3 family only, not "
            f"'{model.family}'; set model.family=deepseek_v3 or leave model.kv_lora_rank unset"
        )
    moe_layers = None
    if model.is_moe and model.first_k_dense_layers:
        moe_layers = tuple(range(model.first_k_dense_layers, model.num_layers))
    return GPTSpec(
        family=model.family,
        num_layers=model.num_layers,
        hidden_size=model.hidden_size,
        num_attention_heads=model.num_attention_heads,
        num_query_groups=model.num_kv_heads,
        ffn_hidden_size=model.ffn_hidden_size,
        vocab_size=model.vocab_size,
        max_position_embeddings=model.max_position_embeddings,
        head_dim=model.head_dim,
        rope_theta=model.rope_theta,
        norm_eps=model.norm_eps,
        tie_word_embeddings=model.tie_word_embeddings,
        qk_layernorm=model.qk_layernorm,
        add_qkv_bias=model.qkv_bias,
        num_experts=model.num_experts,
        moe_ffn_hidden_size=model.moe_ffn_hidden_size,
        moe_router_topk=model.moe_router_topk,
        moe_shared_expert_size=model.num_shared_experts * (model.moe_ffn_hidden_size or 0),
        moe_layers=moe_layers,
        dtype=model.dtype,
    )


def with_checkpoint_architecture(model: ModelConfig) -> ModelConfig:
    """``model`` with its architecture fields read from ``model.hf_path``'s config.json.

    The checkpoint decides the architecture: a recipe need not restate it, and layout
    checks then see the model that will be built. Without a readable config.json the
    section is returned as is (start-up reports missing weights later, in one line).

    Raises:
        ModelSetupError: the checkpoint's architecture cannot be built (names the field).
    """
    import json
    from pathlib import Path

    file = Path(model.hf_path or "") / "config.json"
    if not model.hf_path or not file.is_file():
        return model
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise ModelSetupError(f"cannot read {file}: {exc}") from None
    return model_section_for(_spec_from_checkpoint_config(config, model), model)


def model_section_for(spec: GPTSpec, model: ModelConfig) -> ModelConfig:
    """``model`` with the architecture fields of ``spec`` (the inverse of :func:`gpt_spec`)."""
    yarn = spec.yarn or (None, 4096, 32.0, 1.0, 1.0, 0.0)
    moe = spec.is_moe
    return dataclasses.replace(
        model,
        family=spec.family,
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        num_attention_heads=spec.num_attention_heads,
        num_kv_heads=spec.num_query_groups,
        head_dim=spec.head_dim,
        ffn_hidden_size=spec.ffn_hidden_size,
        vocab_size=spec.vocab_size,
        max_position_embeddings=spec.max_position_embeddings,
        rope_theta=spec.rope_theta,
        norm_eps=spec.norm_eps,
        tie_word_embeddings=spec.tie_word_embeddings,
        qkv_bias=spec.add_qkv_bias,
        qk_layernorm=spec.qk_layernorm,
        num_experts=spec.num_experts,
        moe_ffn_hidden_size=spec.moe_ffn_hidden_size if moe else model.moe_ffn_hidden_size,
        moe_router_topk=spec.moe_router_topk if moe else model.moe_router_topk,
        num_shared_experts=spec.moe_shared_expert_size // (spec.moe_ffn_hidden_size or 1),
        first_k_dense_layers=min(spec.moe_layer_indexes(), default=0),
        q_lora_rank=spec.q_lora_rank,
        kv_lora_rank=spec.kv_lora_rank,
        qk_rope_head_dim=spec.qk_rope_head_dim or model.qk_rope_head_dim,
        qk_nope_head_dim=spec.qk_nope_head_dim or model.qk_nope_head_dim,
        v_head_dim=spec.v_head_dim or model.v_head_dim,
        moe_router_groups=spec.moe_router_num_groups or 1,
        moe_router_group_topk=spec.moe_router_group_topk or 1,
        moe_routed_scaling_factor=spec.moe_router_topk_scaling_factor or 1.0,
        rope_yarn_factor=yarn[0],
        rope_yarn_original_max_position_embeddings=yarn[1],
        rope_yarn_beta_fast=yarn[2],
        rope_yarn_beta_slow=yarn[3],
        rope_yarn_mscale=yarn[4],
        rope_yarn_mscale_all_dim=yarn[5],
    )


def deepseek_v3_hf_config(model: ModelConfig) -> dict:
    """The HF ``DeepseekV3Config`` dictionary of a DeepSeek-V3 ``model`` section."""
    from transformers import AutoConfig

    rope = {"rope_type": "default", "rope_theta": model.rope_theta}
    if model.rope_yarn_factor is not None:
        rope = {
            "rope_type": "yarn",
            "rope_theta": model.rope_theta,
            "factor": model.rope_yarn_factor,
            "original_max_position_embeddings": model.rope_yarn_original_max_position_embeddings,
            "beta_fast": model.rope_yarn_beta_fast,
            "beta_slow": model.rope_yarn_beta_slow,
            "mscale": model.rope_yarn_mscale,
            "mscale_all_dim": model.rope_yarn_mscale_all_dim,
        }
    fields = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "vocab_size": model.vocab_size,
        "hidden_size": model.hidden_size,
        "intermediate_size": model.ffn_hidden_size,
        "moe_intermediate_size": model.moe_ffn_hidden_size or model.ffn_hidden_size,
        "num_hidden_layers": model.num_layers,
        "num_attention_heads": model.num_attention_heads,
        "num_key_value_heads": model.num_attention_heads,
        "q_lora_rank": model.q_lora_rank,
        "kv_lora_rank": model.kv_lora_rank,
        "qk_nope_head_dim": model.qk_nope_head_dim,
        "qk_rope_head_dim": model.qk_rope_head_dim,
        "v_head_dim": model.v_head_dim,
        "n_routed_experts": model.num_experts,
        "n_shared_experts": model.num_shared_experts,
        "num_experts_per_tok": model.moe_router_topk,
        "n_group": model.moe_router_groups,
        "topk_group": model.moe_router_group_topk,
        "routed_scaling_factor": model.moe_routed_scaling_factor,
        "first_k_dense_replace": model.first_k_dense_layers,
        "max_position_embeddings": model.max_position_embeddings,
        "rms_norm_eps": model.norm_eps,
        "rope_parameters": rope,
        "tie_word_embeddings": model.tie_word_embeddings,
        "num_nextn_predict_layers": 0,  # RL trains no multi-token-prediction layer
        # DeepSeek's own config.json fields that vLLM reads (transformers implies them):
        # without them vLLM builds softmax routing and no expert bias.
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "torch_dtype": model.dtype,
    }
    return AutoConfig.for_model("deepseek_v3", **fields).to_dict()


def hf_config_for(spec: GPTSpec) -> dict:
    """An HF ``config.json`` dictionary describing ``spec`` (for the generation engine)."""
    from transformers import AutoConfig

    model_type = HF_MODEL_TYPES.get(spec.family)
    if model_type is None:
        raise ModelSetupError(f"no HF model type for family '{spec.family}'")
    fields = {
        "architectures": [get_family(spec.family).hf_architectures[0]],
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.ffn_hidden_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_query_groups,
        "head_dim": spec.head_dim,
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": spec.norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": spec.rope_theta},
        "tie_word_embeddings": spec.tie_word_embeddings,
        "attention_bias": spec.add_qkv_bias,  # Llama / Qwen3 flag; Qwen2 always has it
        "torch_dtype": spec.dtype,
    }
    if spec.is_moe:
        fields |= {
            "num_experts": spec.num_experts,
            "num_experts_per_tok": spec.moe_router_topk,
            "moe_intermediate_size": spec.moe_ffn_hidden_size,
            "norm_topk_prob": not spec.moe_router_pre_softmax,
        }
    return AutoConfig.for_model(model_type, **fields).to_dict()


def pretrained_config(hf_config: dict):
    """A transformers ``PretrainedConfig`` from a ``config.json`` dictionary."""
    from transformers import AutoConfig

    fields = {k: v for k, v in hf_config.items() if k != "model_type"}
    return AutoConfig.for_model(hf_config["model_type"], **fields)


def initial_model(model: ModelConfig) -> InitialModel:
    """Spec, HF config and starting weights of the policy described by ``model``.

    A checkpoint (``model.hf_path`` or ``model.gguf_package``) decides the architecture;
    the section's shape fields are then ignored (the checkpoint's own config wins).

    Raises:
        ModelSetupError: both sources given, or a checkpoint that cannot be read.
    """
    if model.hf_path and model.gguf_package:
        raise ModelSetupError("set model.hf_path or model.gguf_package, not both")
    if not (model.hf_path or model.gguf_package):
        spec = gpt_spec(model)
        hf_config = deepseek_v3_hf_config(model) if model.family == "deepseek_v3" else None
        return InitialModel(spec, hf_config or hf_config_for(spec), None)
    state, config = _read_checkpoint(model)
    return InitialModel(_spec_from_checkpoint_config(config, model), config, state)


def _spec_from_checkpoint_config(config: dict, model: ModelConfig) -> GPTSpec:
    """The spec an HF ``config.json`` describes, built by its architecture's family.

    Raises:
        ModelSetupError: no family handles the architecture, or the family cannot build
            one of its options (the message names the field).
    """
    architecture = (config.get("architectures") or ["LlamaForCausalLM"])[0]
    try:
        family = family_for_architecture(architecture)
        return family.spec_from_hf_config(config, dtype=model.dtype)
    except (KeyError, ValueError) as exc:
        raise ModelSetupError(f"checkpoint architecture {architecture}: {exc}") from None


def _read_checkpoint(model: ModelConfig) -> tuple[dict[str, torch.Tensor], dict]:
    from backends.megatron.hf_io import hf_state_and_config, load_gguf_model, load_hf_folder

    try:
        if model.hf_path:
            return load_hf_folder(model.hf_path)
        return hf_state_and_config(load_gguf_model(model.gguf_package))
    except (FileNotFoundError, OSError) as exc:
        source = model.hf_path or model.gguf_package
        raise ModelSetupError(f"cannot read model weights from {source!r}: {exc}") from None
