"""What every role starts from: the architecture (a GPTSpec, mindrl/config/specs.py),
its HF config for the generation engine, and the initial weights (random, an HF folder,
or a GGUF file shipped in a package).

Every role (actor, reference, critic, rollout) starts from the same initial weights, so
they are made once per process from the same seed and source; nothing is downloaded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from backends.megatron import GPTSpec
from backends.megatron.families import get_family
from mindrl.config.schema import ModelConfig
from mindrl.config.specs import (
    ModelSetupError,
    gpt_spec,
    section_hf_config,
    spec_from_hf_config,
)


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


def hf_config_for(spec: GPTSpec) -> dict:
    """An HF ``config.json`` dictionary describing ``spec`` (for the generation engine)."""
    from transformers import AutoConfig

    family = get_family(spec.family)
    fields = {
        "architectures": [family.hf_architectures[0]],
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
    return AutoConfig.for_model(family.hf_model_type, **fields).to_dict()


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
        hf_config = section_hf_config(model) or hf_config_for(spec)
        return InitialModel(spec, hf_config, None)
    state, config = _read_checkpoint(model)
    return InitialModel(spec_from_hf_config(config, model.dtype), config, state)


def _read_checkpoint(model: ModelConfig) -> tuple[dict[str, torch.Tensor], dict]:
    from backends.megatron.hf_io import hf_state_and_config, load_gguf_model, load_hf_folder

    try:
        if model.hf_path:
            return load_hf_folder(model.hf_path)
        return hf_state_and_config(load_gguf_model(model.gguf_package))
    except (FileNotFoundError, OSError) as exc:
        source = model.hf_path or model.gguf_package
        raise ModelSetupError(f"cannot read model weights from {source!r}: {exc}") from None
