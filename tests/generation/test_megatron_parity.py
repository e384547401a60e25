"""Generation engines fed with weights from the Megatron training engine reproduce its
greedy decode and its log-probs (issue 6). Weights go Megatron -> HF names directly (the
resharder's TP=1 output is the same full tensors)."""

from __future__ import annotations

import pytest
import torch

from backends.generation import EngineConfig, SamplingParams, get_engine_class
from tests.generation.conftest import (
    ENGINE_PARAMS,
    MAX_MODEL_LEN,
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
        logprobs = engine.forward([{"input_ids": batch}])["logprobs"][:, -1]  # [vocab]
        tokens.append(int(logprobs.argmax()))
    return tokens[len(prompt) :]


def parity_case(rank: int, world: int, engine_name: str) -> dict:
    from backends.megatron import MegatronEngine, ParallelSpec
    from backends.megatron.families import family_for_architecture

    config = tiny_llama_config()
    spec = family_for_architecture("LlamaForCausalLM").spec_from_hf_config(config.to_dict())
    trainer = MegatronEngine(spec, ParallelSpec())
    trainer.load_hf_state_dict(random_weights(seed=1))
    generator = get_engine_class(engine_name)(
        EngineConfig(
            model=config,
            max_model_len=MAX_MODEL_LEN,
            kv_cache_bytes=32 * 2**20,
            enforce_eager=True,
            seed=0,
        )
    )
    generator.load_weights(trainer.hf_state_dict().items())
    results = generator.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    out = {"engine": [], "megatron": [], "engine_logprobs": [], "megatron_logprobs": []}
    for prompt, result in zip(PROMPTS, results, strict=True):
        out["engine"].append(list(result.token_ids))
        out["megatron"].append(megatron_greedy(trainer, prompt, MAX_TOKENS))
        full = torch.tensor([prompt + list(result.token_ids)])
        recomputed = trainer.forward([{"input_ids": full}])["logprobs"][0, len(prompt) :]
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
