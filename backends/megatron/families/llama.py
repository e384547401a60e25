"""Llama family: Llama 2/3, SmolLM2 and Qwen2 (Qwen2 = Llama names + q/k/v biases)."""

from __future__ import annotations

from backends.megatron.families.base import LlamaLikeFamily


class LlamaFamily(LlamaLikeFamily):
    """Llama / SmolLM2: RMSNorm, SwiGLU, RoPE, GQA, no biases."""

    name = "llama"
    hf_architectures = ("LlamaForCausalLM",)
    hf_model_type = "llama"


class Qwen2Family(LlamaLikeFamily):
    """Qwen2 / Qwen2.5: Llama names plus biases on the q/k/v projections."""

    name = "qwen2"
    hf_architectures = ("Qwen2ForCausalLM",)
    hf_model_type = "qwen2"

    def _extra_spec_fields(self, hf_config: dict) -> dict:
        return {"add_qkv_bias": True}
