"""The engine registry, sampling-parameter checks and weight-loading errors."""

from __future__ import annotations

import pytest
import torch

from backends.generation import (
    EngineConfig,
    EngineUnavailableError,
    SamplingParams,
    available_engines,
    get_engine_class,
)
from backends.generation.hf_engine import HFGenerationEngine
from tests.generation.conftest import ENGINE_PARAMS, HAS_VLLM, tiny_llama_config

hf_only = pytest.mark.parametrize("engine", [ENGINE_PARAMS[0]], indirect=True)


def test_the_hf_engine_is_found_by_name():
    assert get_engine_class("hf") is HFGenerationEngine
    assert "hf" in available_engines()


def test_an_unknown_engine_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown generation engine 'sglang'; known: hf, vllm"):
        get_engine_class("sglang")


@pytest.mark.skipif(HAS_VLLM, reason="vllm is installed in this environment")
def test_asking_for_vllm_without_it_says_how_to_install():
    with pytest.raises(EngineUnavailableError, match=r"scripts/install_vllm_cpu\.sh"):
        get_engine_class("vllm")
    assert "vllm" not in available_engines()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n": 0}, "n must be >= 1"),
        ({"temperature": -0.5}, "temperature must be >= 0"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"top_k": -1}, "top_k must be >= 0"),
        ({"max_tokens": 0}, "max_tokens must be >= 1"),
    ],
)
def test_impossible_sampling_params_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_temperature_zero_means_greedy():
    assert SamplingParams(temperature=0).greedy
    assert not SamplingParams(temperature=0.1).greedy


def test_the_hf_engine_refuses_tensor_parallelism():
    config = EngineConfig(model=tiny_llama_config(), tensor_parallel_size=2)
    with pytest.raises(ValueError, match="use the 'vllm' engine"):
        HFGenerationEngine(config)


@hf_only
def test_loading_an_unknown_weight_name_is_refused(engine):
    with pytest.raises(KeyError, match=r"no parameter 'model\.layers\.9\.mlp\.up_proj\.weight'"):
        engine.load_weights([("model.layers.9.mlp.up_proj.weight", torch.zeros(256, 128))])


@hf_only
def test_loading_a_weight_of_the_wrong_shape_is_refused(engine):
    with pytest.raises(ValueError, match=r"has shape \(3, 3\), the model expects \(256, 128\)"):
        engine.load_weights([("model.embed_tokens.weight", torch.zeros(3, 3))])
