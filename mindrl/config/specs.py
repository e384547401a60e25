"""The one mapping from the config to what the training engine builds.

The engine's inputs are its own types (``backends`` never imports ``mindrl``): a
:class:`~backends.megatron.GPTSpec` (architecture), a :class:`~backends.megatron.ParallelSpec`
(layout) and an :class:`~backends.megatron.OptimSpec` (optimizer). Each is made here and
nowhere else, from one table per pair of types, read in both directions where both
directions are needed (a checkpoint's architecture back into the config's model section).
A quantity has one name on both sides, except the GPTSpec fields that keep Megatron-core's
names (:data:`MODEL_TO_SPEC` lists them); the layout and the optimizer share every name.

Megatron-core and transformers are imported by the functions that need them, so reading a
config (or a dry run) never loads them.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mindrl.config.layout import TrainingLayout
from mindrl.config.schema import LORA_DEFAULT_LR, LoRAConfig, ModelConfig, OptimConfig, RoleConfig

if TYPE_CHECKING:  # Megatron-core is loaded by the functions that build specs
    from backends.megatron import GPTSpec, OptimSpec, ParallelSpec
    from backends.megatron.families.vla import VLASpec
    from backends.megatron.lora import LoRASpec


class ModelSetupError(ValueError):
    """The model section cannot be built by the pipeline; the message names the fix."""


#: ModelConfig field -> GPTSpec field, for every quantity both hold as one value; the
#: spec keeps Megatron-core's name where it differs (num_query_groups, add_qkv_bias).
MODEL_TO_SPEC = {
    "family": "family",
    "num_layers": "num_layers",
    "hidden_size": "hidden_size",
    "num_attention_heads": "num_attention_heads",
    "num_kv_heads": "num_query_groups",
    "head_dim": "head_dim",
    "ffn_hidden_size": "ffn_hidden_size",
    "vocab_size": "vocab_size",
    "max_position_embeddings": "max_position_embeddings",
    "rope_theta": "rope_theta",
    "norm_eps": "norm_eps",
    "tie_word_embeddings": "tie_word_embeddings",
    "qk_layernorm": "qk_layernorm",
    "qkv_bias": "add_qkv_bias",
    "num_experts": "num_experts",
}
#: MoE widths: a dense spec leaves them at its defaults, so reading a dense spec back
#: keeps the section's own values.
MOE_FIELDS = {"moe_ffn_hidden_size": "moe_ffn_hidden_size", "moe_router_topk": "moe_router_topk"}
#: DeepSeek-V3's options, which only a multi-latent-attention family builds (from the HF
#: config, :func:`mla_hf_config`), so they are only read back. Multi-latent attention's
#: ranks (None: no MLA) and head widths (0 on a spec without MLA: the section's kept):
MLA_RANKS = ("q_lora_rank", "kv_lora_rank")
MLA_WIDTHS = ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
#: Group-limited routing (None on a spec without it: plain top-k, the section's default).
ROUTER_FIELDS = {
    "moe_router_groups": "moe_router_num_groups",
    "moe_router_group_topk": "moe_router_group_topk",
    "moe_routed_scaling_factor": "moe_router_topk_scaling_factor",
}
#: The config's YaRN fields, in the order of ``GPTSpec.yarn``.
YARN_FIELDS = (
    "rope_yarn_factor",
    "rope_yarn_original_max_position_embeddings",
    "rope_yarn_beta_fast",
    "rope_yarn_beta_slow",
    "rope_yarn_mscale",
    "rope_yarn_mscale_all_dim",
)


def gpt_spec(model: ModelConfig) -> GPTSpec:
    """The engine's :class:`GPTSpec` for a ``model`` section built from scratch."""
    from backends.megatron import GPTSpec
    from backends.megatron.families import FAMILIES

    hf_config = section_hf_config(model)
    if hf_config is not None:
        # One reading of an MLA family's options: the family's, from the HF config.
        return spec_from_hf_config(hf_config, model.dtype)
    if model.uses_mla:
        mla = " / ".join(name for name, family in FAMILIES.items() if family.mla)
        raise ModelSetupError(
            f"model.kv_lora_rank (MLA) is built by the {mla} family only, not "
            f"'{model.family}'; set model.family={mla} or leave model.kv_lora_rank unset"
        )
    fields = {spec: getattr(model, name) for name, spec in (MODEL_TO_SPEC | MOE_FIELDS).items()}
    fields["dtype"] = model.dtype  # the run's choice, never read back from a checkpoint
    # Quantities the two sides count differently: shared experts by number (config) or
    # total width (Megatron); dense leading layers by count or the MoE layers' indexes.
    fields["moe_shared_expert_size"] = model.num_shared_experts * (model.moe_ffn_hidden_size or 0)
    if model.is_moe and model.first_k_dense_layers:
        fields["moe_layers"] = tuple(range(model.first_k_dense_layers, model.num_layers))
    return GPTSpec(**fields)


def vla_spec(model: ModelConfig, reward_level: str = "chunk") -> VLASpec:
    """The engine's :class:`VLASpec` (a vision-language-action family's inputs and
    outputs) for ``model.vla``: the same names on both sides; the value head gives one
    value per unit of ``reward_level`` (``algorithm.reward_level``: a chunk or each of
    its actions)."""
    from backends.megatron.families.vla import VLASpec

    per_chunk = model.vla.chunk_size if reward_level == "action" else 1
    return VLASpec(**dataclasses.asdict(model.vla), values_per_chunk=per_chunk)


def model_section_for(spec: GPTSpec, model: ModelConfig) -> ModelConfig:
    """``model`` with the architecture fields of ``spec`` (the inverse of :func:`gpt_spec`)."""
    fields = {name: getattr(spec, field) for name, field in MODEL_TO_SPEC.items()}
    if spec.is_moe:
        fields |= {name: getattr(spec, field) for name, field in MOE_FIELDS.items()}
    defaults = ModelConfig()
    fields |= {name: getattr(spec, name) for name in MLA_RANKS}
    fields |= {name: getattr(spec, name) or getattr(model, name) for name in MLA_WIDTHS}
    fields |= {
        name: getattr(spec, field) or getattr(defaults, name)
        for name, field in ROUTER_FIELDS.items()
    }
    fields["num_shared_experts"] = spec.moe_shared_expert_size // (spec.moe_ffn_hidden_size or 1)
    fields["first_k_dense_layers"] = min(spec.moe_layer_indexes(), default=0)
    yarn = spec.yarn or (None, *(getattr(defaults, name) for name in YARN_FIELDS[1:]))
    fields |= dict(zip(YARN_FIELDS, yarn, strict=True))
    return dataclasses.replace(model, **fields)


def with_checkpoint_architecture(model: ModelConfig) -> ModelConfig:
    """``model`` with its architecture fields read from ``model.hf_path``'s config.json.

    The checkpoint decides the architecture: a recipe need not restate it, and layout
    checks then see the model that will be built. Without a readable config.json the
    section is returned as is (start-up reports missing weights later, in one line).

    Raises:
        ModelSetupError: the checkpoint's architecture cannot be built (names the field).
    """
    file = Path(model.hf_path or "") / "config.json"
    if not model.hf_path or not file.is_file():
        return model
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise ModelSetupError(f"cannot read {file}: {exc}") from None
    return model_section_for(spec_from_hf_config(config, model.dtype), model)


def spec_from_hf_config(config: dict, dtype: str) -> GPTSpec:
    """The spec an HF ``config.json`` describes, built by its architecture's family.

    Raises:
        ModelSetupError: no family handles the architecture, or the family cannot build
            one of its options (the message names the field).
    """
    from backends.megatron.families import family_for_architecture

    architecture = (config.get("architectures") or ["LlamaForCausalLM"])[0]
    try:
        family = family_for_architecture(architecture)
        return family.spec_from_hf_config(config, dtype=dtype)
    except (KeyError, ValueError) as exc:
        raise ModelSetupError(f"checkpoint architecture {architecture}: {exc}") from None


def section_hf_config(model: ModelConfig) -> dict | None:
    """The HF config a section of a multi-latent-attention family is built through (the
    family reads its options from it); None for the other families, whose spec is the
    section's fields (:func:`gpt_spec`)."""
    from backends.megatron.families import get_family

    family = get_family(model.family)
    return (
        mla_hf_config(model, family.hf_architectures[0], family.hf_model_type)
        if family.mla
        else None
    )


def mla_hf_config(model: ModelConfig, architecture: str, model_type: str) -> dict:
    """The HF config dictionary (DeepSeek-V3's schema, ``model_type``) of an MLA family's
    ``model`` section."""
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
        "architectures": [architecture],
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
    return AutoConfig.for_model(model_type, **fields).to_dict()


def parallel_spec(layout: TrainingLayout) -> ParallelSpec:
    """The engine's layout of a role: its resolved training layout, field for field."""
    from backends.megatron import ParallelSpec

    return ParallelSpec(
        **{field.name: getattr(layout, field.name) for field in dataclasses.fields(ParallelSpec)}
    )


def optim_spec(optim: OptimConfig, total_steps: int) -> OptimSpec:
    """The engine's optimizer of a trained role: its ``optim`` section, field for field,
    and the schedule's length in optimizer steps."""
    from backends.megatron import OptimSpec

    settings = {field.name: getattr(optim, field.name) for field in dataclasses.fields(optim)}
    return OptimSpec(total_steps=max(total_steps, 1), **settings)


@dataclass(frozen=True)
class EngineSpecs:
    """What one model role's training engine is built with, resolved by the driver from
    the run plan and handed to every rank of the role.

    Attributes:
        parallel: the role's training layout.
        optim: its optimizer and schedule; ``None`` for a role that only scores (reference).
        lora: the adapters it trains instead of its weights (``None``: full weights).
    """

    parallel: ParallelSpec
    optim: OptimSpec | None
    lora: LoRASpec | None = None


def engine_specs(
    section: RoleConfig, layout: TrainingLayout, total_steps: int | None
) -> EngineSpecs:
    """A role's engine specs: its layout, and its optimizer over ``total_steps`` optimizer
    steps (``None``: the role does not train)."""
    optim = None if total_steps is None else optim_spec(section.optim, total_steps)
    lora = lora_spec(section.lora) if optim is not None else None
    if lora is not None:  # the optimizer holds the adapters only: their rate is its rate
        optim = dataclasses.replace(optim, lr=section.lora.lr or LORA_DEFAULT_LR)
    return EngineSpecs(parallel_spec(layout), optim, lora)


def lora_spec(lora: LoRAConfig) -> LoRASpec | None:
    """The engine's adapters of a trained role's ``lora`` section (``None``: rank 0)."""
    from backends.megatron.lora import LoRASpec

    if not lora.enabled:
        return None
    alpha = lora.alpha if lora.alpha is not None else 2.0 * lora.rank
    return LoRASpec(lora.rank, alpha, lora.dropout, tuple(lora.targets))
