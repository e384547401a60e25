"""Qwen3 family: dense Qwen3 (per-head q/k RMSNorm) and Qwen3-MoE (routed experts)."""

from __future__ import annotations

from backends.megatron.families.base import LlamaLikeFamily


class Qwen3Family(LlamaLikeFamily):
    """Dense Qwen3: Llama names plus ``q_norm`` / ``k_norm`` and an explicit head_dim."""

    name = "qwen3"
    hf_architectures = ("Qwen3ForCausalLM",)
    hf_model_type = "qwen3"

    def _extra_spec_fields(self, hf_config: dict) -> dict:
        return {"qk_layernorm": True, "add_qkv_bias": bool(hf_config.get("attention_bias", False))}


class Qwen3MoeFamily(Qwen3Family):
    """Qwen3-MoE: every layer (minus ``mlp_only_layers``) routes to ``num_experts`` experts.

    HF names: ``mlp.gate`` is the router, ``mlp.experts.{e}.{gate,up,down}_proj`` the
    experts; Qwen3-MoE has no shared experts.
    """

    name = "qwen3_moe"
    hf_architectures = ("Qwen3MoeForCausalLM",)
    hf_model_type = "qwen3_moe"

    def _extra_spec_fields(self, hf_config: dict) -> dict:
        dense_only = set(hf_config.get("mlp_only_layers") or ())
        layers = hf_config["num_hidden_layers"]
        return {
            **super()._extra_spec_fields(hf_config),
            # transformers 5 renamed num_experts to num_local_experts.
            "num_experts": hf_config.get("num_experts") or hf_config["num_local_experts"],
            "moe_ffn_hidden_size": hf_config["moe_intermediate_size"],
            "moe_router_topk": hf_config["num_experts_per_tok"],
            "moe_layers": tuple(i for i in range(layers) if i not in dense_only),
            # HF's default is False: top-k of the full softmax, not renormalised.
            "moe_router_pre_softmax": not hf_config.get("norm_topk_prob", False),
        }
