"""A tiny random DeepSeek-V3 and the functions its spawned parity ranks run.

Three layers (the first dense), 8 routed experts in 4 groups (2 groups per token,
4 experts per token, so a group is scored by its top 2 experts as in HF), one shared
expert, YaRN rope with mscale, a non-zero expert bias; the query is low-rank or full.
The HF model is the reference: its weights are drawn once per seed and every Megatron
layout loads them through the family conversion.
"""

from __future__ import annotations

import torch

from backends.megatron import MegatronEngine, OptimSpec, ParallelSpec
from backends.megatron.builder import destroy_parallel
from backends.megatron.families import get_family
from backends.megatron.sharding import gather_full_state_dict

FAMILY = get_family("deepseek_v3")
#: Ranks of the low-rank query: on (the 671B model's shape) and off (full-rank query).
Q_LORA = {"q_lora": 32, "q_full": None}
SEQ = 12


def tiny_config(q_lora_rank: int | None = 32, mtp_layers: int = 0):
    """The transformers config of the tiny DeepSeek-V3."""
    import transformers

    return transformers.DeepseekV3Config(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=q_lora_rank,
        kv_lora_rank=30,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        n_routed_experts=8,
        n_group=4,
        topk_group=2,
        num_experts_per_tok=4,
        n_shared_experts=1,
        first_k_dense_replace=1,
        routed_scaling_factor=2.5,
        max_position_embeddings=256,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
        },
        num_nextn_predict_layers=mtp_layers,
        tie_word_embeddings=False,
    )


def tiny_model(q_lora_rank: int | None = 32, seed: int = 0):
    """A tiny DeepSeek-V3 with weights large enough to route and attend unevenly."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.DeepseekV3ForCausalLM(tiny_config(q_lora_rank)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn_like(param)
            param.copy_(1 + 0.1 * noise if "norm" in name else 0.08 * noise)
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(0.1 * torch.randn_like(buffer))
    return model


def hf_state(model) -> dict[str, torch.Tensor]:
    """The checkpoint (per-expert) names of ``model``'s tensors."""
    from backends.generation.hf_experts import unfuse_experts

    return unfuse_experts(dict(model.state_dict()))


def tokens(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 96, (4, SEQ), generator=torch.Generator().manual_seed(seed))


def whole_sequence_batch(ids: torch.Tensor, advantages: torch.Tensor | None = None):
    """Every token after the first is a response token (its log-prob is scored)."""
    from backends.megatron.batch import ResponseBatch  # the engine's response-aligned input

    rows, width = ids.shape[0], ids.shape[1] - 1
    fields = {} if advantages is None else {"advantages": advantages}
    return ResponseBatch(ids, torch.ones(rows, dtype=torch.long), torch.ones(rows, width), fields)


def hf_logprobs(model, ids: torch.Tensor) -> torch.Tensor:
    """``log p(token_t | tokens_<t)`` for t >= 1 from the HF model, ``[B, S - 1]``."""
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[:, :-1].float(), -1)
    return logp.gather(-1, ids[:, 1:, None]).squeeze(-1)


def policy_loss(outputs: dict, batch, counts) -> torch.Tensor:
    """A REINFORCE-style per-token loss: touches every weight the log-probs read."""
    return -outputs["logprobs"] * batch.fields["advantages"]


def engine_for(parallel: ParallelSpec, q_lora_rank: int | None, optim: OptimSpec | None):
    model = tiny_model(q_lora_rank)
    spec = FAMILY.spec_from_hf_config(model.config.to_dict())
    engine = MegatronEngine(spec, parallel, optim)
    engine.load_hf_state_dict(hf_state(model))
    return engine


def logprobs_at(parallel: ParallelSpec, q_lora_rank: int | None) -> torch.Tensor:
    """Megatron log-probs of the tiny model at ``parallel``."""
    engine = engine_for(parallel, q_lora_rank, None)
    logprobs = engine.forward(whole_sequence_batch(tokens()))["logprobs"]
    destroy_parallel()
    return logprobs


def train_step_at(parallel: ParallelSpec) -> dict:
    """One optimizer step (low-rank query): loss, grad norm, full grads and new weights."""
    import torch.distributed as dist

    engine = engine_for(parallel, Q_LORA["q_lora"], OptimSpec(lr=1e-3, clip_grad=0.0))
    advantages = torch.randn(4, SEQ - 1, generator=torch.Generator().manual_seed(3))
    batch = whole_sequence_batch(tokens(), advantages)
    metrics = engine.train_step(batch, policy_loss)
    result = {
        "loss": metrics["loss"],
        "grad_norm": metrics["grad_norm"],
        "grads": gather_full_state_dict(engine.model, grads=True),
        "weights": engine.full_state_dict(),
        "layouts": engine.param_layouts(),
    }
    destroy_parallel()
    dist.barrier()
    return result


#: Layouts the parity test runs on two ranks, with the query ranks each one checks
#: (the full-rank query adds a build per layout, so it runs on the most sharded one).
TWO_RANK_LAYOUTS = {
    "tp2": (ParallelSpec(tp=2), ("q_lora",)),
    "ep2": (ParallelSpec(ep=2), ("q_lora",)),
    "pp2": (ParallelSpec(pp=2, first_stage_layers=1), ("q_lora",)),
    "tp2_ep2": (ParallelSpec(tp=2, ep=2), ("q_lora", "q_full")),
}


def one_rank(rank: int, world: int) -> dict:
    """TP1: log-probs with both query kinds and the reference training step."""
    logprobs = {label: logprobs_at(ParallelSpec(), q) for label, q in Q_LORA.items()}
    return {"tp1": logprobs, "step": train_step_at(ParallelSpec())}


def two_ranks(rank: int, world: int) -> dict:
    """Every two-rank layout's log-probs, and the TP2 x EP2 training step."""
    out = {
        name: {label: logprobs_at(parallel, Q_LORA[label]) for label in labels}
        for name, (parallel, labels) in TWO_RANK_LAYOUTS.items()
    }
    out["step"] = train_step_at(ParallelSpec(tp=2, ep=2))
    return out


def tiny_spec(q_lora_rank: int | None = 32):
    """The engine's GPTSpec of the tiny DeepSeek-V3 (MLA, YaRN, grouped sigmoid routing)."""
    return FAMILY.spec_from_hf_config(tiny_config(q_lora_rank).to_dict())
