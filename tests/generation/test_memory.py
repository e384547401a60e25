"""Sleep really gives memory back: weights (hf, level 2) and the KV cache (vllm)."""

from __future__ import annotations

import pytest

from backends.generation import SamplingParams
from tests.generation.conftest import ENGINE_PARAMS

PROMPTS = [[5, 17, 42], [200]]


@pytest.mark.parametrize("engine", [ENGINE_PARAMS[0]], indirect=True)
def test_hf_sleep_level_2_frees_every_weight_storage(engine, weights_a):
    engine.sleep(level=2)
    try:
        assert all(p.untyped_storage().nbytes() == 0 for p in engine.model.parameters())
    finally:
        engine.wake_up()
        engine.load_weights(weights_a.items())
    assert all(p.untyped_storage().nbytes() > 0 for p in engine.model.parameters())


@pytest.mark.parametrize("engine", [ENGINE_PARAMS[1]], indirect=True)
def test_vllm_sleep_releases_the_kv_cache_and_wake_up_takes_it_back(engine):
    if engine.native_sleep:
        pytest.skip("native sleep mode: vLLM's allocator releases the cache itself")
    held = engine.kv_cache_bytes()
    engine.sleep(level=1)
    try:
        asleep = engine.kv_cache_bytes()
    finally:
        engine.wake_up()

    assert held >= 32 * 2**20 * 0.9  # the configured cache, give or take block rounding
    assert asleep == 0
    assert engine.kv_cache_bytes() == held
    assert len(engine.generate(PROMPTS, SamplingParams(max_tokens=4, seed=0))) == 2
