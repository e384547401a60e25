"""What the engine builds: architecture (:class:`GPTSpec`) and layout (:class:`ParallelSpec`).

These are the engine's own input types so that ``backends`` never imports ``mindrl``;
mindrl maps its ``ModelConfig`` / ``ParallelConfig`` onto them in one place. The rules a
layout must obey (sizes that divide the world and the model, pipeline stage layers) are
mindrl's layout validator's, checked before any engine is built and reported all at once
in config terms; :func:`validate` keeps only what this engine cannot build whatever the
layout's arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: float64 is for the CPU tests that compare the engine's own maths (packed vs plain rows,
#: fused vs Megatron's local attention) without float32 rounding in the way.
DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}


@dataclass(frozen=True)
class GPTSpec:
    """Architecture of a Llama / Qwen2 / Qwen3 / DeepSeek-V3 style decoder, dense or MoE.

    Attributes:
        family: model family file in ``backends/megatron/families`` (``llama``, ``qwen2``,
            ``qwen3``, ``qwen3_moe``, ``deepseek_v3``).
        num_layers: transformer layers.
        hidden_size: model width.
        num_attention_heads: query heads.
        num_query_groups: key/value heads (GQA groups).
        ffn_hidden_size: dense SwiGLU width.
        vocab_size: real vocabulary size (the engine pads it to a multiple of TP).
        max_position_embeddings: longest supported sequence.
        head_dim: per-head width (Megatron's ``kv_channels``); ``None`` resolves to
            ``hidden_size // num_attention_heads`` when the spec is made.
        rope_theta: RoPE base.
        norm_eps: RMSNorm epsilon.
        tie_word_embeddings: output layer shares the input embedding.
        qk_layernorm: RMSNorm on each q and k head (Qwen3).
        add_qkv_bias: bias on the q/k/v projections (Qwen2).
        num_experts: routed experts per MoE layer; 0 is a dense model.
        moe_ffn_hidden_size: width of one routed expert.
        moe_router_topk: experts per token.
        moe_shared_expert_size: total width of the always-on shared experts (0: none).
        moe_layers: indexes of the MoE layers; ``None`` means every layer when
            ``num_experts > 0``.
        moe_aux_loss_coeff: load-balancing loss weight (0 keeps losses comparable).
        moe_router_pre_softmax: softmax over all experts, then the top-k probabilities
            as they are (HF ``norm_topk_prob=False``); ``False``: top-k logits, then a
            softmax over those k, i.e. renormalised (HF ``norm_topk_prob=True``).
        moe_router_score_function: ``softmax`` or ``sigmoid`` (DeepSeek-V3; Megatron then
            always renormalises the top-k scores, i.e. HF ``norm_topk_prob=True``).
        moe_router_expert_bias: a per-expert bias (HF ``e_score_correction_bias``) added to
            the scores for choosing experts only, never to the weights.
        moe_router_num_groups: expert groups for group-limited top-k (HF ``n_group``).
        moe_router_group_topk: groups each token may use (HF ``topk_group``).
        moe_router_topk_scaling_factor: factor on the routing weights
            (HF ``routed_scaling_factor``).
        q_lora_rank: multi-latent attention query rank; ``None``: full-rank query.
        kv_lora_rank: multi-latent attention key/value rank; ``None``: no MLA (GQA).
        qk_nope_head_dim: MLA q/k head part without rotary embedding.
        qk_rope_head_dim: MLA q/k head part with rotary embedding.
        v_head_dim: MLA value head width.
        yarn: YaRN rope scaling as ``(factor, original_max_position_embeddings, beta_fast,
            beta_slow, mscale, mscale_all_dim)``; ``None``: plain RoPE (MLA only).
        dtype: parameter dtype name (``float32``, ``bfloat16``, ``float16``).
    """

    family: str = "llama"
    num_layers: int = 2
    hidden_size: int = 64
    num_attention_heads: int = 4
    num_query_groups: int = 4
    ffn_hidden_size: int = 128
    vocab_size: int = 128
    max_position_embeddings: int = 512
    head_dim: int | None = None
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    qk_layernorm: bool = False
    add_qkv_bias: bool = False
    num_experts: int = 0
    moe_ffn_hidden_size: int | None = None
    moe_router_topk: int = 2
    moe_shared_expert_size: int = 0
    moe_layers: tuple[int, ...] | None = None
    moe_aux_loss_coeff: float = 0.0
    moe_router_pre_softmax: bool = False
    moe_router_score_function: str = "softmax"
    moe_router_expert_bias: bool = False
    moe_router_num_groups: int | None = None
    moe_router_group_topk: int | None = None
    moe_router_topk_scaling_factor: float | None = None
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    yarn: tuple[float, int, float, float, float, float] | None = None
    dtype: str = "float32"

    def __post_init__(self) -> None:
        # One name for the per-head width: resolved here, so every reader sees an int.
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)

    @classmethod
    def from_dict(cls, fields: dict) -> GPTSpec:
        """A spec from ``dataclasses.asdict`` of one (a checkpoint's meta); checkpoints
        written before the per-head width was called ``head_dim`` name it ``kv_channels``."""
        fields = dict(fields)
        if "kv_channels" in fields:
            fields["head_dim"] = fields.pop("kv_channels")
        return cls(**fields)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def uses_mla(self) -> bool:
        """Multi-latent attention (DeepSeek): low-rank key/value (and query) projections."""
        return self.kv_lora_rank is not None

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def moe_layer_indexes(self) -> tuple[int, ...]:
        """Global indexes of the layers whose MLP is a mixture of experts."""
        if not self.is_moe:
            return ()
        return tuple(range(self.num_layers)) if self.moe_layers is None else self.moe_layers

    def padded_vocab_size(self, tp: int) -> int:
        """Vocabulary rounded up to a multiple of ``tp`` (the padded rows are masked)."""
        return -(-self.vocab_size // tp) * tp


@dataclass(frozen=True)
class ParallelSpec:
    """Training layout. Data parallel size is whatever the world size leaves over.

    Attributes:
        tp: tensor parallel size.
        pp: pipeline parallel size.
        cp: context parallel size: each packed row is split over ``cp`` ranks, whose
            attention exchanges what it needs (``attention.py``).
        ep: expert parallel size.
        etp: expert tensor parallel size.
        first_stage_layers: layers of the first pipeline stage when they differ from the
            others' (the rest split evenly over the other ``pp - 1`` stages; the first
            stage also holds the embedding). None: all stages equal.
        activation_checkpointing: recompute every transformer layer in backward (Megatron's
            full, uniform recompute, one layer per checkpoint): only each layer's input is
            kept from the forward pass. Not a parallel size, but a per-device memory
            choice that belongs with the layout it is made for.
    """

    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    first_stage_layers: int | None = None
    activation_checkpointing: bool = False

    @property
    def sequence_parallel(self) -> bool:
        """Megatron sequence parallelism, on whenever ``tp > 1``.

        MoE needs it with TP > 1 (each TP rank routes only its own ``s / tp`` tokens,
        otherwise every token would reach its experts ``tp`` times). Dense models get it
        too: it splits the norm/residual activations ``tp`` ways for the same traffic
        (an all-reduce is a reduce-scatter + all-gather), it is Megatron's recommended
        TP setting, and one TP code path keeps the dense TP tests covering the MoE one.
        The price: sequences are right-padded to a multiple of ``tp`` inside the engine.
        """
        return self.tp > 1


def validate(spec: GPTSpec, parallel: ParallelSpec) -> None:
    """Raise ``ValueError`` for what this engine cannot build under any world size.

    The layout arithmetic (world, heads, layers and experts divisible) is not checked
    here: mindrl's layout validator refuses it before an engine is built, and a direct
    caller gets Megatron-core's own assertion from ``initialize_model_parallel``.
    """
    if spec.dtype not in DTYPES:
        raise ValueError(f"GPTSpec.dtype '{spec.dtype}' is unknown; choose one of {list(DTYPES)}")
