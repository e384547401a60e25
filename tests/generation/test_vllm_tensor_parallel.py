"""vLLM with generation TP = 2 inside the actor's process group, fed by the resharder.

Each rank runs its own vLLM engine (``external_launcher``) and loads only its own
shards: the tiny config's vocabulary (32) splits differently in Megatron (16 rows per
rank) and in vLLM (padded to 64, 32 rows per rank), so the whole-vocabulary hand-over is
exercised too. The reference is the training engine itself: its greedy decode and its
recomputed log-probs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from backends.generation import SamplingParams
from backends.megatron import ResponseBatch
from tests.generation.conftest import HAS_VLLM, NO_VLLM_REASON
from tests.support.spawn import run_ranks

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not HAS_VLLM, reason=NO_VLLM_REASON)]

TINY = Path(__file__).parents[2] / "configs" / "tiny.yaml"
PROMPTS = [[1, 5, 9], [2, 7, 7, 3, 11], [4]]
STEPS = 6


def megatron_greedy(engine, prompt: list[int], steps: int, vocab: int) -> list[int]:
    """Argmax decode with the training engine: score every candidate next token at once."""
    tokens = list(prompt)
    for _ in range(steps):
        prefix = torch.tensor(tokens).expand(vocab, len(tokens))
        batch = torch.cat([prefix, torch.arange(vocab).unsqueeze(1)], dim=1)
        last = ResponseBatch.continuation(batch, start=len(tokens))  # the candidate token
        logprobs = engine.forward(last)["logprobs"][:, 0]
        tokens.append(int(logprobs.argmax()))
    return tokens[len(prompt) :]


def decode_and_compare(rollout, trainer, vocab: int) -> dict:
    """Greedy-decode with the engine (weights freshly resharded), then with Megatron."""
    rollout.refresh_weights()
    results = rollout.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=STEPS))
    sampled = rollout.generate(PROMPTS, SamplingParams(n=2, max_tokens=STEPS, seed=7))
    rollout.restore_training_state()
    out = {"engine": [], "megatron": [], "max_logprob_diff": 0.0}
    out["sampled"] = [list(r.token_ids) for r in sampled]
    for prompt, result in zip(PROMPTS, results, strict=True):
        out["engine"].append(list(result.token_ids))
        out["megatron"].append(megatron_greedy(trainer, prompt, STEPS, vocab))
        full = torch.tensor([prompt + list(result.token_ids)])
        recomputed = trainer.forward(ResponseBatch.continuation(full, start=len(prompt)))[
            "logprobs"
        ][0]
        diff = (torch.tensor(result.logprobs) - recomputed.float()).abs().max().item()
        out["max_logprob_diff"] = max(out["max_logprob_diff"], diff)
    return out


MOE = [
    "model.family=qwen3_moe",
    "model.num_experts=4",
    "model.moe_ffn_hidden_size=64",
    "model.qk_layernorm=true",
    "actor.parallel.ep=2",
]


def tp2_generation_case(rank: int, world: int, train_tp: int, extra: list[str]) -> dict:
    from mindrl.config.layout import training_layout
    from mindrl.config.loader import load_config
    from mindrl.config.specs import parallel_spec
    from mindrl.workers.model_setup import initial_model
    from mindrl.workers.roles import MegatronEngine
    from mindrl.workers.rollout import Rollout

    overrides = [f"actor.parallel.tp={train_tp}", "rollout.tp=2", "rollout.engine=vllm"]
    config = load_config(TINY, [*overrides, "rollout.kv_cache_mib=16", *extra])
    initial = initial_model(config.model)
    layout = training_layout(config.actor, config.model, world)
    trainer = MegatronEngine(initial.spec, parallel_spec(layout), seed=config.seed)
    rollout = Rollout(trainer, config, initial, world)
    first = decode_and_compare(rollout, trainer, initial.spec.vocab_size)
    with torch.no_grad():  # new weights: the engine must serve these, not cached ones
        for param in trainer.named_parameters().values():
            param.mul_(-1.5)
    second = decode_and_compare(rollout, trainer, initial.spec.vocab_size)
    return {"first": first, "second": second}


@pytest.mark.parametrize(
    ("train_tp", "extra"),
    [(2, []), (1, []), (2, MOE)],
    ids=["train-tp2", "train-tp1-dp2", "moe-train-tp2-ep2"],
)
def test_tp2_engine_reproduces_the_training_engine_after_each_weight_update(train_tp, extra):
    """MoE: experts are tensor-split over the two generation ranks (vLLM TP, no EP)."""
    ranks = run_ranks(tp2_generation_case, 2, train_tp, extra, timeout_s=300)
    for out in ranks:
        for update in ("first", "second"):
            assert out[update]["engine"] == out[update]["megatron"], update
            assert out[update]["max_logprob_diff"] < 1e-4, update
        assert out["first"]["engine"] != out["second"]["engine"]  # the update took effect
    # Both TP peers drove one engine: identical samples, also when sampling with a seed.
    assert ranks[0]["first"]["sampled"] == ranks[1]["first"]["sampled"]
    assert ranks[0]["second"]["sampled"] == ranks[1]["second"]["sampled"]


def test_dense_shards_pass_as_they_are_an_expert_lands_at_its_rank_offset_bad_sizes_fail():
    from backends.generation.vllm_engine import for_vllm_loader

    expert = "model.layers.0.mlp.experts.1.down_proj.weight"
    shapes = {"o_proj.weight": (4, 6), "norm.weight": (4,), expert: (4, 6)}
    shard = torch.arange(8.0).reshape(4, 2)
    assert for_vllm_loader("o_proj.weight", shard, shapes, tp=3, rank=2)[1] is shard
    _, full = for_vllm_loader(expert, shard, shapes, tp=3, rank=2)
    assert full.shape == (4, 6) and torch.equal(full[:, 4:6], shard)
    norm = torch.ones(4)
    assert for_vllm_loader("norm.weight", norm, shapes, tp=3, rank=1)[1] is norm
    with pytest.raises(ValueError, match=r"'o_proj.weight' has shape \[4, 3\]"):
        for_vllm_loader("o_proj.weight", torch.zeros(4, 3), shapes, tp=3, rank=0)
    with pytest.raises(KeyError, match="lm_head"):
        for_vllm_loader("lm_head.weight", norm, shapes, tp=3, rank=0)
