"""Both generation engines serve a tiny DeepSeek-V3 (MLA, sigmoid routing with the expert
bias, a shared expert, a dense first layer) from HF-named weights, as the resharder
hands them over, and decode it greedily like transformers.

vLLM's MLA kernels take one latent width, ``kv_lora_rank + qk_rope_head_dim = 576``
(DeepSeek-V3's 512 + 64), so this model has it; vLLM also reads DeepSeek's own
``scoring_func`` / ``topk_method`` fields, which ``mla_hf_config`` writes.
"""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from backends.generation import EngineConfig, SamplingParams, get_engine_class
from backends.generation.hf_experts import unfuse_experts
from tests.generation.conftest import HAS_VLLM, NO_VLLM_REASON
from tests.megatron.deepseek_cases import tiny_config

PROMPTS = [[1, 2, 3, 4], [5, 6, 7, 8, 9]]
GREEDY = SamplingParams(max_tokens=6, temperature=0.0)


def vllm_sized_config():
    config = tiny_config()
    config.architectures = ["DeepseekV3ForCausalLM"]
    config.scoring_func, config.topk_method = "sigmoid", "noaux_tc"
    config.kv_lora_rank, config.qk_rope_head_dim = 512, 64
    config.head_dim, config.qk_head_dim = 64, 80
    return config


@pytest.fixture(scope="module")
def model_and_weights():
    import transformers

    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(vllm_sized_config()).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn_like(param)
            param.copy_(1 + 0.1 * noise if "norm" in name else 0.08 * noise)
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(0.1 * torch.randn_like(buffer))
    return model, unfuse_experts(dict(model.state_dict()))


def transformers_greedy(model) -> list[list[int]]:
    out = []
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            for _ in range(GREEDY.max_tokens):
                next_id = model(ids).logits[0, -1].argmax()
                ids = torch.cat([ids, next_id.view(1, 1)], dim=1)
        out.append(ids[0, len(prompt) :].tolist())
    return out


@pytest.mark.parametrize(
    "engine",
    [
        "hf",
        pytest.param(
            "vllm",
            marks=[pytest.mark.vllm, pytest.mark.skipif(not HAS_VLLM, reason=NO_VLLM_REASON)],
        ),
    ],
)
def test_the_engine_decodes_deepseek_v3_like_transformers(model_and_weights, engine):
    model, weights = model_and_weights
    if engine == "vllm":
        # A process of its own: an in-process vLLM engine keeps its parallel groups for the
        # process's life, and another test's dense engine left them without the expert group.
        with mp.get_context("spawn").Pool(1) as pool:
            tokens = pool.apply(greedy_tokens, (engine, model.config, weights))
    else:
        tokens = greedy_tokens(engine, model.config, weights)
    assert tokens == transformers_greedy(model)


def greedy_tokens(engine: str, model_config, weights: dict) -> list[list[int]]:
    config = EngineConfig(
        model=model_config, max_model_len=64, kv_cache_bytes=64 << 20, enforce_eager=True
    )
    generator = get_engine_class(engine)(config)
    generator.load_weights(weights.items())  # the expert bias included, by its HF name
    return [list(result.token_ids) for result in generator.generate(PROMPTS, GREEDY)]
