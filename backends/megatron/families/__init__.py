"""Model families, one file each: HF names <-> Megatron names and HF config -> GPTSpec.

``get_family(name)`` returns the family object; an unknown name lists the known ones.
"""

from __future__ import annotations

from backends.megatron.families.base import LlamaLikeFamily
from backends.megatron.families.deepseek_v3 import DeepseekV3Family
from backends.megatron.families.llama import LlamaFamily, Qwen2Family
from backends.megatron.families.qwen3 import Qwen3Family, Qwen3MoeFamily
from backends.megatron.families.vla import VLAFamily

FAMILIES: dict[str, LlamaLikeFamily] = {
    family.name: family
    for family in (
        LlamaFamily(),
        Qwen2Family(),
        Qwen3Family(),
        Qwen3MoeFamily(),
        DeepseekV3Family(),
        VLAFamily(),
    )
}


def get_family(name: str) -> LlamaLikeFamily:
    """The family called ``name`` (``llama``, ``qwen2``, ``qwen3``, ``qwen3_moe``, ...)."""
    if name not in FAMILIES:
        raise ValueError(f"unknown model family '{name}'; known: {', '.join(FAMILIES)}")
    return FAMILIES[name]


def family_for_architecture(architecture: str) -> LlamaLikeFamily:
    """The family of an HF ``architectures[0]`` entry such as ``LlamaForCausalLM``."""
    for family in FAMILIES.values():
        if architecture in family.hf_architectures:
            return family
    known = [a for f in FAMILIES.values() for a in f.hf_architectures]
    raise ValueError(f"no model family handles HF architecture '{architecture}'; known: {known}")
