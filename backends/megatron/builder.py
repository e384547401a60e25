"""Build a Megatron-core ``GPTModel`` from a :class:`GPTSpec` on the current process groups.

The process groups come from ``megatron.core.parallel_state`` initialised on top of the
device layer's default group (:func:`initialize_parallel`). The TransformerEngine layer
spec is used when TE imports and the device is an accelerator; otherwise the local
(pure PyTorch) spec with torch's fused attention kernels as core attention
(``attention.py``; Megatron's local one materialises the scores). MoE layers use the
``alltoall`` token dispatcher on accelerators and ``allgather`` on the CPU, whose
alltoall dispatcher creates a CUDA stream.

With ``tp > 1`` sequence parallelism is on (:attr:`ParallelSpec.sequence_parallel`):
activations outside attention/MLP are ``[s / tp, b, h]``. The local spec's norm refuses
it, so :class:`SequenceParallelNorm` takes its place (see there).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from backends.device import get_device
from backends.megatron.attention import torch_core_attention
from backends.megatron.cpu_compat import megatron_compat
from backends.megatron.layouts import tag_expert_params
from backends.megatron.spec import GPTSpec, ParallelSpec, validate


def initialize_parallel(parallel: ParallelSpec, seed: int = 0) -> None:
    """Create Megatron's TP/PP/CP/EP/DP groups over the already-initialised default group.

    Call after ``get_device().init_process_group(...)``. Seeds Megatron's TP RNG tracker.
    """
    if not dist.is_initialized():
        raise RuntimeError(
            "torch.distributed is not initialised; call get_device().init_process_group(...) first"
        )
    with megatron_compat(get_device()):  # first: on the CPU it imports Megatron its way
        from megatron.core import parallel_state, tensor_parallel

        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=parallel.tp,
            pipeline_model_parallel_size=parallel.pp,
            context_parallel_size=parallel.cp,
            expert_model_parallel_size=parallel.ep,
            expert_tensor_parallel_size=parallel.etp,
        )
        tensor_parallel.model_parallel_cuda_manual_seed(seed)


def destroy_parallel() -> None:
    """Tear Megatron's process groups down (the default group stays)."""
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()


def use_transformer_engine() -> bool:
    """TE spec only where TE imports and the device is not the CPU (TE has no CPU kernels)."""
    if get_device().torch_device_type == "cpu":
        return False
    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        return False
    return True


def token_dispatcher() -> str:
    """Megatron's MoE token dispatcher here: ``alltoall`` on accelerators; ``allgather``
    on the CPU (the alltoall one creates a CUDA stream), which gathers equal token counts
    from every rank of its TP x EP group."""
    return "allgather" if get_device().torch_device_type == "cpu" else "alltoall"


def uses_te_attention(parallel: ParallelSpec) -> bool:
    """TE's layer spec where TE can run it; context parallelism takes the torch core
    attention (packed rows; the engine's own CP exchange) even where TE is installed."""
    return use_transformer_engine() and parallel.cp == 1


def _rope_for_the_whole_row(model: nn.Module) -> None:
    """Rotary embeddings that never cut their frequencies by CP rank: Megatron's slice
    the sequence for its own CP split when the CP group has several ranks, while here each
    token's frequencies are picked by its position in the whole row (``packing.rope_at``)."""
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    for module in model.modules():
        if isinstance(module, RotaryEmbedding):  # YaRN's included
            module.cp_group = None


def transformer_config(spec: GPTSpec, parallel: ParallelSpec):  # -> TransformerConfig
    """Megatron ``TransformerConfig`` for ``spec`` under ``parallel``."""
    from megatron.core.transformer import TransformerConfig

    on_cpu = get_device().torch_device_type == "cpu"
    moe = {}
    if spec.is_moe:
        moe_layers = set(spec.moe_layer_indexes())
        moe = {
            "num_moe_experts": spec.num_experts,
            "moe_ffn_hidden_size": spec.moe_ffn_hidden_size or spec.ffn_hidden_size,
            "moe_router_topk": spec.moe_router_topk,
            "moe_shared_expert_intermediate_size": spec.moe_shared_expert_size or None,
            "moe_layer_freq": [int(i in moe_layers) for i in range(spec.num_layers)],
            "moe_token_dispatcher_type": token_dispatcher(),
            "moe_router_load_balancing_type": "aux_loss" if spec.moe_aux_loss_coeff else "none",
            "moe_aux_loss_coeff": spec.moe_aux_loss_coeff,
            "moe_router_pre_softmax": spec.moe_router_pre_softmax,
            **deepseek_routing(spec),
        }
    recompute = {}
    if parallel.activation_checkpointing:
        # Full recompute of each layer; sequence parallelism already splits the kept
        # layer inputs over TP (distribute_saved_activations would do it twice).
        recompute = {
            "recompute_granularity": "full",
            "recompute_method": "uniform",
            "recompute_num_layers": 1,
        }
    config_class = TransformerConfig
    if spec.uses_mla:
        from megatron.core.transformer.transformer_config import MLATransformerConfig

        config_class = MLATransformerConfig
    return config_class(
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        num_attention_heads=spec.num_attention_heads,
        num_query_groups=spec.num_query_groups,
        kv_channels=spec.v_head_dim if spec.uses_mla else spec.head_dim,  # MLA: output width
        ffn_hidden_size=spec.ffn_hidden_size,
        tensor_model_parallel_size=parallel.tp,
        sequence_parallel=parallel.sequence_parallel,
        pipeline_model_parallel_size=parallel.pp,
        num_layers_in_first_pipeline_stage=parallel.first_stage_layers,
        # Megatron's own CP paths need TransformerEngine: the model runs as if cp were 1
        # and the torch core attention does the CP exchange (attention.py); the CP group
        # itself exists (initialize_parallel gets the real cp).
        context_parallel_size=1,
        expert_model_parallel_size=parallel.ep,
        expert_tensor_parallel_size=parallel.etp,
        normalization="RMSNorm",
        layernorm_epsilon=spec.norm_eps,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=spec.add_qkv_bias,
        qk_layernorm=spec.qk_layernorm or spec.uses_mla,  # MLA: the q / kv latent norms
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=on_cpu,
        params_dtype=spec.torch_dtype,
        bf16=spec.dtype == "bfloat16",
        fp16=spec.dtype == "float16",
        pipeline_dtype=spec.torch_dtype,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        **moe,
        **recompute,
        **multi_latent_attention(spec),
    )


def deepseek_routing(spec: GPTSpec) -> dict:
    """Megatron's own router options for DeepSeek-V3 routing (empty for softmax routers).

    The expert bias steers which experts are chosen, not their weights. RL does not
    update it (update rate 0; the engine never calls Megatron's bias update either): the
    aux-loss-free update is a load-balancing controller fitted over pre-training's token
    stream, while RL batches are small and reward-filtered, so updating it would move the
    routing, i.e. the policy, by batch noise outside the clipped objective, and the
    generation engine would route differently from the trainer until the next sync. Kept
    fixed, the checkpoint's bias is the one both engines use.
    """
    if spec.moe_router_score_function == "softmax":
        return {}
    return {
        "moe_router_score_function": spec.moe_router_score_function,
        "moe_router_enable_expert_bias": spec.moe_router_expert_bias,
        "moe_router_bias_update_rate": 0.0,
        "moe_router_num_groups": spec.moe_router_num_groups,
        "moe_router_group_topk": spec.moe_router_group_topk,
        "moe_router_topk_scaling_factor": spec.moe_router_topk_scaling_factor,
        # HF scores DeepSeek routers in float32 whatever the model dtype.
        "moe_router_dtype": "fp32",
    }


def multi_latent_attention(spec: GPTSpec) -> dict:
    """``MLATransformerConfig`` fields of ``spec`` (empty without MLA)."""
    if not spec.uses_mla:
        return {}
    fields = {
        "q_lora_rank": spec.q_lora_rank,
        "kv_lora_rank": spec.kv_lora_rank,
        "qk_head_dim": spec.qk_nope_head_dim,
        "qk_pos_emb_head_dim": spec.qk_rope_head_dim,
        "v_head_dim": spec.v_head_dim,
        "rotary_base": spec.rope_theta,
        "rope_type": "rope",
    }
    if spec.yarn is not None:
        factor, original, beta_fast, beta_slow, mscale, mscale_all_dim = spec.yarn
        fields |= {
            "rope_type": "yarn",
            "rotary_scaling_factor": factor,
            "original_max_position_embeddings": original,
            "beta_fast": beta_fast,
            "beta_slow": beta_slow,
            "mscale": mscale,
            "mscale_all_dim": mscale_all_dim,
        }
    return fields


class ValueHead(nn.Module):
    """Critic head: a replicated ``hidden -> 1`` projection in place of the output layer.

    Called like Megatron's output layer (``(hidden [s, b, h], weight=...) -> (out, bias)``)
    so ``GPTModel`` returns values ``[b, s, 1]`` where it would return logits. Under
    sequence parallelism ``hidden`` is ``[s / tp, b, h]``: the values are gathered over TP
    and the weight is tagged ``sequence_parallel`` (its grad is a partial sum per TP rank).
    """

    def __init__(self, hidden_size: int, dtype: torch.dtype, sequence_parallel: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1, hidden_size, dtype=dtype))
        self.sequence_parallel = sequence_parallel
        self.weight.sequence_parallel = sequence_parallel

    def forward(self, hidden: torch.Tensor, weight=None, runtime_gather_output=None):
        values = hidden @ self.weight.t()  # [s / tp, b, 1] under SP, else [s, b, 1]
        if self.sequence_parallel:
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            # Every TP rank computes the same loss from the gathered values, so the
            # backward keeps this rank's slice of the grad instead of summing tp copies.
            values = gather_from_sequence_parallel_region(values, tensor_parallel_output_grad=False)
        return values, None


class SequenceParallelNorm:
    """Megatron's ``WrappedTorchNorm`` (local spec) minus its sequence-parallel refusal.

    ``WrappedTorchNorm`` asserts ``not config.sequence_parallel`` because a plain torch norm
    does not tag its weight ``sequence_parallel``, so Megatron's grad finalisation would
    skip the TP all-reduce that SP makes necessary (each TP rank sees ``s / tp`` tokens).
    This one builds the same torch module and tags it; ``optim.reduce_gradients`` sums
    tagged grads over TP.
    """

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, **unused: Any) -> nn.Module:
        kinds = {"RMSNorm": torch.nn.RMSNorm, "LayerNorm": torch.nn.LayerNorm}
        if config.normalization not in kinds:
            raise ValueError(f"normalization '{config.normalization}' is not RMSNorm/LayerNorm")
        norm = kinds[config.normalization](hidden_size, eps=eps)
        for param in norm.parameters():
            param.sequence_parallel = config.sequence_parallel
        return norm


def _replace_module(node: Any, old: type, new: type, field: str | None = None) -> Any:
    """A copy of a layer-spec tree (ModuleSpec / submodule dataclasses / lists) with
    every ``old`` module class replaced by ``new`` (only in submodule ``field`` if given)."""
    if node is old and field is None:
        return new
    if isinstance(node, list):
        return [_replace_module(item, old, new, field) for item in node]
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        changes = {
            f.name: new
            if f.name == field and getattr(node, f.name) is old
            else _replace_module(getattr(node, f.name), old, new, field)
            for f in dataclasses.fields(node)
            if f.init
        }
        return dataclasses.replace(node, **changes)
    return node


def decoder_block_spec(config, use_te: bool):
    """Megatron's GPT block spec. Without TE: torch's fused attention kernels as core
    attention (``attention.py``) and local-spec norms made sequence-parallel capable."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    block = get_gpt_decoder_block_spec(
        config, use_transformer_engine=use_te, normalization="RMSNorm"
    )
    if use_te:  # TE's norms handle SP themselves; its attention is fused already
        return block
    block = _replace_module(block, DotProductAttention, torch_core_attention())
    if config.sequence_parallel:
        block = _replace_module(block, WrappedTorchNorm, SequenceParallelNorm)
    if config.multi_latent_attention:
        block = _replicated_mla_down_projections(block)
    return block


def _replicated_mla_down_projections(block: Any) -> Any:
    """MLA's q / kv down projections as Megatron's replicated ``Linear`` (local spec).

    The local spec builds them column-parallel, and then megatron-core 0.16.1 loses
    gradient under TP > 1: the shared rotary key (the last ``qk_rope_head_dim`` rows of
    the kv down projection) is gathered over TP and read by every rank's own heads, but
    the gather's backward only keeps each rank's slice of its partial gradient, never
    summing the other ranks' heads' parts. The replicated ``Linear`` (what TE's spec uses
    too, as a duplicated TELinear) takes Megatron's other branch, whose sequence-parallel
    gather of the rotary key reduce-scatters that gradient; its weight is tagged
    ``sequence_parallel`` so its per-rank partial gradient is summed over TP.
    """
    from megatron.core.post_training.modelopt.layers import Linear
    from megatron.core.tensor_parallel import ColumnParallelLinear

    for field in ("linear_q_down_proj", "linear_kv_down_proj"):
        block = _replace_module(block, ColumnParallelLinear, Linear, field)
    return block


def build_gpt(spec: GPTSpec, parallel: ParallelSpec, value_head: bool = False, seed: int = 0):
    """This rank's ``GPTModel`` stage (pre/post-process set from its pipeline rank).

    Args:
        spec: architecture.
        parallel: layout; Megatron groups must already exist (:func:`initialize_parallel`).
        value_head: replace the vocabulary output layer by :class:`ValueHead` (critic).
        seed: CPU seed for the (full, then sliced) initial weights, same on every rank.
    """
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel

    validate(spec, parallel)
    device = get_device()
    with megatron_compat(device):
        config = transformer_config(spec, parallel)
        layer_spec = decoder_block_spec(config, uses_te_attention(parallel))
        torch.manual_seed(seed)
        model = GPTModel(
            config=config,
            transformer_layer_spec=layer_spec,
            vocab_size=spec.padded_vocab_size(parallel.tp),
            max_sequence_length=spec.max_position_embeddings,
            pre_process=parallel_state.is_pipeline_first_stage(),
            post_process=parallel_state.is_pipeline_last_stage(),
            share_embeddings_and_output_weights=spec.tie_word_embeddings and not value_head,
            position_embedding_type="rope",
            rotary_base=int(spec.rope_theta),
        )
        if value_head and model.post_process:
            model.output_layer = ValueHead(
                spec.hidden_size, spec.torch_dtype, parallel.sequence_parallel
            )
        tag_expert_params(model)
        _rope_for_the_whole_row(model)
    if spec.torch_dtype == torch.float64:  # Megatron's torch norms are built in float32
        model = model.double()
    return model.to(device.device())
