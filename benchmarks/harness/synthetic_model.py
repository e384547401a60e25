"""A Megatron-named parameter set with random weights, built from a ModelConfig.

It has exactly the parameters :mod:`mindrl.planner.params` counts (GQA attention with
fused qkv, SwiGLU MLP with fused gate/up, routed + shared experts, router, norms,
vocab-parallel embedding and output layer), so measured memory can be compared with
the analytic model. Names are global (global layer and expert numbers).
"""

from __future__ import annotations

import torch

from backends.layout import ParamLayout
from mindrl.config import ModelConfig
from mindrl.config.layout import stage_layer_counts

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _attention(m: ModelConfig, prefix: str) -> dict[str, ParamLayout]:
    h, d = m.hidden_size, m.head_dim
    qkv_rows = d * (m.num_attention_heads + 2 * m.num_kv_heads)
    out = {
        f"{prefix}.input_layernorm.weight": ParamLayout("replicated", (h,)),
        f"{prefix}.self_attention.linear_qkv.weight": ParamLayout("column", (qkv_rows, h)),
        f"{prefix}.self_attention.linear_proj.weight": ParamLayout(
            "row", (h, m.num_attention_heads * d)
        ),
    }
    if m.qkv_bias:
        out[f"{prefix}.self_attention.linear_qkv.bias"] = ParamLayout("column", (qkv_rows,))
    if m.qk_layernorm:
        for which in ("q", "k"):
            out[f"{prefix}.self_attention.{which}_layernorm.weight"] = ParamLayout(
                "replicated", (d,)
            )
    return out


def _swiglu(prefix: str, h: int, ffn: int, expert: int | None = None) -> dict[str, ParamLayout]:
    return {
        f"{prefix}.linear_fc1.weight": ParamLayout("column", (2 * ffn, h), 2, expert),
        f"{prefix}.linear_fc2.weight": ParamLayout("row", (h, ffn), 1, expert),
    }


def _mlp(m: ModelConfig, prefix: str, layer: int) -> dict[str, ParamLayout]:
    h = m.hidden_size
    out = {f"{prefix}.pre_mlp_layernorm.weight": ParamLayout("replicated", (h,))}
    if not m.is_moe or layer < m.first_k_dense_layers:
        return out | _swiglu(f"{prefix}.mlp", h, m.ffn_hidden_size)
    ffn = m.moe_ffn_hidden_size or m.ffn_hidden_size
    out[f"{prefix}.mlp.router.weight"] = ParamLayout("replicated", (m.num_experts, h))
    for e in range(m.num_experts):
        out |= _swiglu(f"{prefix}.mlp.experts.local_experts.{e}", h, ffn, e)
    if m.num_shared_experts:
        out |= _swiglu(f"{prefix}.mlp.shared_experts", h, ffn * m.num_shared_experts)
    return out


def synthetic_layouts(m: ModelConfig) -> dict[str, ParamLayout]:
    """Global name -> layout for every parameter of the model."""
    if m.uses_mla:
        raise ValueError("synthetic models cover GQA attention only; set model.kv_lora_rank: null")
    v, h = m.vocab_size, m.hidden_size
    layouts = {"embedding.word_embeddings.weight": ParamLayout("vocab", (v, h))}
    for layer in range(m.num_layers):
        prefix = f"decoder.layers.{layer}"
        layouts |= _attention(m, prefix) | _mlp(m, prefix, layer)
    layouts["decoder.final_layernorm.weight"] = ParamLayout("replicated", (h,))
    if not m.tie_word_embeddings:
        layouts["output_layer.weight"] = ParamLayout("vocab", (v, h))
    return layouts


def synthetic_weights(
    m: ModelConfig, seed: int = 0, device: torch.device | str = "cpu"
) -> tuple[dict[str, torch.Tensor], dict[str, ParamLayout]]:
    """Random full weights (``model.dtype``) and their layouts."""
    layouts = synthetic_layouts(m)
    generator = torch.Generator().manual_seed(seed)
    full = {
        name: torch.randn(layout.full_shape, generator=generator).to(DTYPES[m.dtype]).to(device)
        for name, layout in layouts.items()
    }
    return full, layouts


def stage_of(name: str, m: ModelConfig, pp: int, first_stage_layers: int | None = None) -> int:
    """Pipeline stage holding ``name`` under Megatron's split (embedding first, head last)."""
    if name.startswith("embedding."):
        return 0
    if name.startswith(("decoder.final_layernorm", "output_layer")):
        return pp - 1
    layer = int(name.split(".")[2])
    from mindrl.config import ParallelConfig

    counts = stage_layer_counts(
        ParallelConfig(pp=pp, first_stage_layers=first_stage_layers), m.num_layers
    )
    boundary = 0
    for stage, count in enumerate(counts):
        boundary += count
        if layer < boundary:
            return stage
    raise ValueError(f"layer {layer} of '{name}' is past the last pipeline stage")
