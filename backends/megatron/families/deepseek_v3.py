"""DeepSeek-V3 family: multi-latent attention, sigmoid group-limited routing, shared experts.

HF names (transformers 5 ``DeepseekV3ForCausalLM``; fused experts are split into
per-expert names by ``backends.generation.hf_experts.unfuse_experts`` first) and their
canonical Megatron (local spec) names, per layer:

=========================================  ===========================================
``self_attn.q_proj`` (q_lora_rank None)     ``self_attention.linear_q_proj``
``self_attn.q_a_proj``                      ``self_attention.linear_q_down_proj``
``self_attn.q_a_layernorm``                 ``self_attention.q_layernorm``
``self_attn.q_b_proj``                      ``self_attention.linear_q_up_proj``
``self_attn.kv_a_proj_with_mqa``            ``self_attention.linear_kv_down_proj``
``self_attn.kv_a_layernorm``                ``self_attention.kv_layernorm``
``self_attn.kv_b_proj``                     ``self_attention.linear_kv_up_proj``
``mlp.gate.e_score_correction_bias``        ``mlp.router.expert_bias`` (a buffer)
=========================================  ===========================================

The tensors are equal, no reordering: HF and Megatron both lay the up projections out
head by head (``[nope | rope]`` for q, ``[nope | v]`` for kv), so a contiguous split is a
TP split (column layout); the down projections (``[latent | shared rope key]`` for kv)
are replicated (see ``builder._replicated_mla_down_projections``).
Both apply the rotary part to interleaved pairs (HF ``rope_interleave``; Megatron does
it for every MLA model). Layers ``< first_k_dense_replace`` have a dense MLP.

Multi-token-prediction weights (``model.layers.{num_hidden_layers}...``) are not trained
in RL (the policy's log-probs never read them): ``hf_to_megatron`` skips them and
:meth:`DeepseekV3Family.untrained_hf_tensors` hands them back unchanged for export.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from backends.megatron.families.base import LlamaLikeFamily, Tensors
from backends.megatron.spec import GPTSpec

#: HF attention name -> Megatron ``self_attention.`` name (weights; norms included).
_MLA_NAMES = {
    "q_proj.weight": "linear_q_proj.weight",
    "q_a_proj.weight": "linear_q_down_proj.weight",
    "q_a_layernorm.weight": "q_layernorm.weight",
    "q_b_proj.weight": "linear_q_up_proj.weight",
    "kv_a_proj_with_mqa.weight": "linear_kv_down_proj.weight",
    "kv_a_layernorm.weight": "kv_layernorm.weight",
    "kv_b_proj.weight": "linear_kv_up_proj.weight",
}
_LOW_RANK_QUERY = ("q_a_proj.weight", "q_a_layernorm.weight", "q_b_proj.weight")
_ROUTER_BIAS_HF = ".e_score_correction_bias"
_ROUTER_BIAS_MG = "router.expert_bias"


class UnsupportedCheckpoint(ValueError):
    """An HF config asks for an option this family cannot build; the message names it."""


class DeepseekV3Family(LlamaLikeFamily):
    """DeepSeek-V3 / R1: MLA attention, DeepSeek MoE (routed + shared experts)."""

    name = "deepseek_v3"
    hf_architectures = ("DeepseekV3ForCausalLM",)
    hf_model_type = "deepseek_v3"
    mla = True

    # ---- attention -------------------------------------------------------------------
    def _attention_to_megatron(self, hf: Tensors, spec: GPTSpec, attn: str, dst: str) -> Tensors:
        return {
            f"{dst}self_attention.{mg}": hf[attn + name] for name, mg in _mla_names(spec).items()
        }

    def _attention_to_hf(
        self, full: Tensors, spec: GPTSpec, src: str, attn: str
    ) -> Iterator[tuple[str, torch.Tensor]]:
        for name, mg in _mla_names(spec).items():
            yield attn + name, full[f"{src}self_attention.{mg}"]

    # ---- router bias -----------------------------------------------------------------
    def _mlp_to_megatron(self, hf: Tensors, spec: GPTSpec, layer: int) -> Tensors:
        out = super()._mlp_to_megatron(hf, spec, layer)
        if layer in spec.moe_layer_indexes() and spec.moe_router_expert_bias:
            src = f"model.layers.{layer}.{self.hf_router}{_ROUTER_BIAS_HF}"
            out[f"decoder.layers.{layer}.mlp.{_ROUTER_BIAS_MG}"] = hf[src]
        return out

    def _mlp_to_hf(
        self, full: Tensors, spec: GPTSpec, layer: int
    ) -> Iterator[tuple[str, torch.Tensor]]:
        yield from super()._mlp_to_hf(full, spec, layer)
        if layer in spec.moe_layer_indexes() and spec.moe_router_expert_bias:
            src = f"decoder.layers.{layer}.mlp.{_ROUTER_BIAS_MG}"
            yield f"model.layers.{layer}.{self.hf_router}{_ROUTER_BIAS_HF}", full[src]

    # ---- multi-token prediction ------------------------------------------------------
    def untrained_hf_tensors(self, hf: Tensors, spec: GPTSpec) -> Tensors:
        """The checkpoint's multi-token-prediction layers (``model.layers.{>= num_layers}``),
        which the engine does not build; add them to an export unchanged."""
        return {name: t for name, t in hf.items() if _layer_index(name) >= spec.num_layers}

    # ---- HF config -> spec -----------------------------------------------------------
    def spec_from_hf_config(self, hf_config: dict, dtype: str = "float32") -> GPTSpec:
        _refuse_unsupported(hf_config)
        return super().spec_from_hf_config(hf_config, dtype)

    def _extra_spec_fields(self, hf_config: dict) -> dict:
        layers = hf_config["num_hidden_layers"]
        moe_size = hf_config["moe_intermediate_size"]
        return {
            # MLA has no query groups: every head has its own key and value.
            "num_query_groups": hf_config["num_attention_heads"],
            "head_dim": None,
            "q_lora_rank": hf_config.get("q_lora_rank"),
            "kv_lora_rank": hf_config["kv_lora_rank"],
            "qk_nope_head_dim": hf_config["qk_nope_head_dim"],
            "qk_rope_head_dim": hf_config["qk_rope_head_dim"],
            "v_head_dim": hf_config["v_head_dim"],
            "yarn": _yarn(hf_config),
            "num_experts": _routed_experts(hf_config),
            "moe_ffn_hidden_size": moe_size,
            "moe_router_topk": hf_config["num_experts_per_tok"],
            "moe_shared_expert_size": (hf_config.get("n_shared_experts") or 0) * moe_size,
            "moe_layers": tuple(range(hf_config.get("first_k_dense_replace") or 0, layers)),
            "moe_router_score_function": "sigmoid",
            "moe_router_expert_bias": True,
            **_group_limited(hf_config),
            "moe_router_topk_scaling_factor": float(hf_config.get("routed_scaling_factor", 1.0)),
        }


def _mla_names(spec: GPTSpec) -> dict[str, str]:
    if spec.q_lora_rank is None:
        return {k: v for k, v in _MLA_NAMES.items() if k not in _LOW_RANK_QUERY}
    return {k: v for k, v in _MLA_NAMES.items() if k != "q_proj.weight"}


def _layer_index(name: str) -> int:
    parts = name.split(".")
    if len(parts) > 2 and parts[:2] == ["model", "layers"] and parts[2].isdigit():
        return int(parts[2])
    return -1


def _routed_experts(hf_config: dict) -> int:
    # transformers 5 maps num_local_experts onto n_routed_experts; config.json has the latter.
    return hf_config.get("n_routed_experts") or hf_config["num_local_experts"]


def _rope_parameters(hf_config: dict) -> dict:
    # transformers 5 calls it rope_parameters; DeepSeek's own config.json rope_scaling.
    return hf_config.get("rope_parameters") or hf_config.get("rope_scaling") or {}


def _yarn(hf_config: dict) -> tuple[float, int, float, float, float, float] | None:
    rope = _rope_parameters(hf_config)
    if rope.get("rope_type", rope.get("type", "default")) != "yarn":
        return None
    return (
        float(rope["factor"]),
        int(rope["original_max_position_embeddings"]),
        float(rope.get("beta_fast", 32.0)),
        float(rope.get("beta_slow", 1.0)),
        float(rope.get("mscale", 1.0)),
        float(rope.get("mscale_all_dim", 0.0)),
    )


def _group_limited(hf_config: dict) -> dict:
    groups, group_topk = hf_config.get("n_group") or 1, hf_config.get("topk_group") or 1
    if group_topk >= groups:  # every group allowed: plain top-k
        return {}
    return {"moe_router_num_groups": groups, "moe_router_group_topk": group_topk}


def _refuse_unsupported(hf_config: dict) -> None:
    """Raise :class:`UnsupportedCheckpoint` naming the first field the engine cannot build."""
    rope = _rope_parameters(hf_config)
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    checks = (
        (
            rope_type not in ("default", "yarn"),
            f"rope_parameters.rope_type={rope_type!r}: only 'default' and 'yarn' are supported "
            "by Megatron's multi-latent attention",
        ),
        (
            hf_config.get("rope_interleave", True) is False,
            "rope_interleave=false: Megatron's multi-latent attention rotates interleaved "
            "pairs only",
        ),
        (
            bool(hf_config.get("attention_bias")),
            "attention_bias=true: Megatron's multi-latent attention has no projection biases",
        ),
        (
            hf_config.get("hidden_act", "silu") != "silu",
            f"hidden_act={hf_config.get('hidden_act')!r}: only 'silu' (SwiGLU) is supported",
        ),
        (
            hf_config.get("norm_topk_prob", True) is False,
            "norm_topk_prob=false: Megatron's sigmoid router always renormalises the top-k weights",
        ),
        (
            bool(_group_limited(hf_config))
            and hf_config["num_experts_per_tok"] // hf_config["topk_group"] != 2,
            "num_experts_per_tok / topk_group must be 2: HF scores an expert group by its "
            "top-2 experts, Megatron by its top num_experts_per_tok / topk_group",
        ),
    )
    for failed, message in checks:
        if failed:
            raise UnsupportedCheckpoint(f"DeepSeek-V3 checkpoint config {message}")
