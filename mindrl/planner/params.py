"""Parameter counts of a model config, split by how tensor/expert parallelism shards them.

The split is what the memory model needs: ``tp`` parameters are divided by the tensor
parallel size, ``expert`` parameters by EP * ETP, ``replicated`` ones by nothing. Counts
are per pipeline stage so the busiest stage can be planned for (the embedding sits on
the first stage, the output layer and final norm on the last).
"""

from __future__ import annotations

from dataclasses import dataclass

from mindrl.config import ModelConfig
from mindrl.config.schema import LoRAConfig

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts (elements, not bytes) by sharding kind."""

    tp: int = 0
    expert: int = 0
    replicated: int = 0

    def __add__(self, other: ParamCounts) -> ParamCounts:
        return ParamCounts(
            self.tp + other.tp, self.expert + other.expert, self.replicated + other.replicated
        )

    def scaled(self, k: int) -> ParamCounts:
        return ParamCounts(self.tp * k, self.expert * k, self.replicated * k)

    @property
    def total(self) -> int:
        return self.tp + self.expert + self.replicated


def attention_params(m: ModelConfig) -> ParamCounts:
    h, heads = m.hidden_size, m.num_attention_heads
    if m.uses_mla:
        qk_head = m.qk_nope_head_dim + m.qk_rope_head_dim
        q = (
            h * m.q_lora_rank + m.q_lora_rank * heads * qk_head
            if m.q_lora_rank
            else h * heads * qk_head
        )
        kv_down = h * (m.kv_lora_rank + m.qk_rope_head_dim)  # replicated: no head dim to split
        kv_up = m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
        out = heads * m.v_head_dim * h
        norms = (m.q_lora_rank or 0) + m.kv_lora_rank + h
        q_down = h * m.q_lora_rank if m.q_lora_rank else 0
        return ParamCounts(tp=q - q_down + kv_up + out, replicated=q_down + kv_down + norms)
    d = m.head_dim
    qkv = h * d * (heads + 2 * m.num_kv_heads)
    bias = d * (heads + 2 * m.num_kv_heads) if m.qkv_bias else 0
    out = heads * d * h
    norms = h + (2 * d if m.qk_layernorm else 0)
    return ParamCounts(tp=qkv + bias + out, replicated=norms)


def mlp_params(m: ModelConfig, layer: int) -> ParamCounts:
    h = m.hidden_size
    norm = ParamCounts(replicated=h)
    if not m.is_moe or layer < m.first_k_dense_layers:
        return norm + ParamCounts(tp=3 * h * m.ffn_hidden_size)  # SwiGLU: gate, up, down
    expert_ffn = m.moe_ffn_hidden_size or m.ffn_hidden_size
    routed = m.num_experts * 3 * h * expert_ffn
    shared = m.num_shared_experts * 3 * h * expert_ffn
    router = h * m.num_experts
    return norm + ParamCounts(tp=shared, expert=routed, replicated=router)


def layer_params(m: ModelConfig, layer: int) -> ParamCounts:
    return attention_params(m) + mlp_params(m, layer)


def embedding_params(m: ModelConfig) -> ParamCounts:
    return ParamCounts(tp=m.vocab_size * m.hidden_size)  # vocab-parallel


def output_params(m: ModelConfig) -> ParamCounts:
    head = 0 if m.tie_word_embeddings else m.vocab_size * m.hidden_size
    return ParamCounts(tp=head, replicated=m.hidden_size)  # final norm replicated


def model_params(m: ModelConfig) -> ParamCounts:
    """Whole-model counts."""
    total = embedding_params(m) + output_params(m)
    for layer in range(m.num_layers):
        total = total + layer_params(m, layer)
    return total


def activated_params(m: ModelConfig) -> int:
    """Parameters one token runs through: all but the routed experts it is not sent to."""
    counts = model_params(m)
    if not m.is_moe:
        return counts.total
    unused_share = 1 - m.moe_router_topk / m.num_experts
    return counts.total - round(counts.expert * unused_share)


def _adapter(rank: int, inputs: int, outputs: int, column: bool) -> ParamCounts:
    """``A [rank, in]`` and ``B [out, rank]`` of one linear, split as the linear is: a
    column-parallel one splits ``B`` over TP, a row-parallel one ``A``."""
    split, whole = (outputs * rank, rank * inputs) if column else (rank * inputs, outputs * rank)
    return ParamCounts(tp=split, replicated=whole)


def layer_lora_params(m: ModelConfig, lora: LoRAConfig, layer: int) -> ParamCounts:
    """One layer's adapters (``backends/megatron/lora.py``): routed experts get none, shared
    experts the MLP's; MLA has no fused qkv (only its output projection takes one)."""
    h, r, targets = m.hidden_size, lora.rank, set(lora.targets)
    counts = ParamCounts()
    if "qkv" in targets and not m.uses_mla:
        counts += _adapter(r, h, m.head_dim * (m.num_attention_heads + 2 * m.num_kv_heads), True)
    if "proj" in targets:
        width = m.v_head_dim if m.uses_mla else m.head_dim
        counts += _adapter(r, m.num_attention_heads * width, h, False)
    dense = not m.is_moe or layer < m.first_k_dense_layers
    ffn = m.ffn_hidden_size if dense else m.num_shared_experts * (m.moe_ffn_hidden_size or 0)
    if ffn and "fc1" in targets:
        counts += _adapter(r, h, 2 * ffn, True)
    if ffn and "fc2" in targets:
        counts += _adapter(r, ffn, h, False)
    return counts


def lora_stage_params(
    m: ModelConfig, lora: LoRAConfig, stage_layers: list[int]
) -> list[ParamCounts]:
    """Adapter counts per pipeline stage (the output layer's on the last)."""
    stages, first_layer = [], 0
    for s, n_layers in enumerate(stage_layers):
        counts = ParamCounts()
        for layer in range(first_layer, first_layer + n_layers):
            counts += layer_lora_params(m, lora, layer)
        first_layer += n_layers
        if s == len(stage_layers) - 1 and "output" in lora.targets:
            counts += _adapter(lora.rank, m.hidden_size, m.vocab_size, True)
        stages.append(counts)
    return stages


def stage_params(m: ModelConfig, stage_layers: list[int]) -> list[ParamCounts]:
    """Counts per pipeline stage for the given layers-per-stage split."""
    stages, first_layer = [], 0
    for s, n_layers in enumerate(stage_layers):
        counts = ParamCounts()
        for layer in range(first_layer, first_layer + n_layers):
            counts = counts + layer_params(m, layer)
        first_layer += n_layers
        if s == 0:
            counts = counts + embedding_params(m)
        if s == len(stage_layers) - 1:
            counts = counts + output_params(m)
        stages.append(counts)
    return stages
