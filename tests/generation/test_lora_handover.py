"""A LoRA policy reaches the generation engine as its base, once, and then its adapters
only: the engine merges them into a pristine copy of the base, so its weights are the
trained policy's after any number of hand-overs, in bfloat16 too (docs/architecture.md
§13). The actor's side, base once then adapters, is tests/megatron/test_lora.py's."""

from __future__ import annotations

import pytest
import torch

from backends.generation import EngineConfig
from backends.generation.hf_engine import HFGenerationEngine
from tests.generation.conftest import random_weights, tiny_llama_config

SCALE = 2.0
RANK = 4
HAND_OVERS = 100
ADAPTED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(autouse=True)
def one_thread():
    """Thousands of tiny merges: one thread each, as the spawned ranks run (on a busy
    2-core machine two threads made them 70 times slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def adapted_modules(weights: dict[str, torch.Tensor]) -> list[str]:
    return [n.removesuffix(".weight") for n in weights if n.split(".")[-2] in ADAPTED]


def adapters_of_round(weights: dict, round_: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Changing adapters, one draw per hand-over, sized as a trained LoRA's (``B @ A`` of
    the weights' order: a 16-bit merge of it rounds)."""
    gen = torch.Generator().manual_seed(round_)
    out = {}
    for module in adapted_modules(weights):
        rows, cols = weights[f"{module}.weight"].shape
        a = torch.randn(RANK, cols, generator=gen) * 0.3
        b = torch.randn(rows, RANK, generator=gen) * 0.3
        out[module] = (a, b)
    return out


def fresh_merge(base: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``cast(base + s * B @ A)``, summed in float32, written out independently of the code."""
    return (base.float() + SCALE * (b.float() @ a.float())).to(base.dtype)


def bf16_engine() -> tuple[HFGenerationEngine, dict[str, torch.Tensor]]:
    """A bfloat16 transformers engine holding a random base; the base as loaded."""
    config = EngineConfig(tiny_llama_config(), dtype=torch.bfloat16, device="cpu")
    engine = HFGenerationEngine(config)
    base = {n: t.to(torch.bfloat16) for n, t in random_weights(seed=3).items()}
    engine.load_weights(base.items())
    return engine, base


def test_a_hundred_bf16_hand_overs_leave_the_weights_exactly_the_base_merged_with_the_last():
    engine, base = bf16_engine()
    for round_ in range(HAND_OVERS):
        engine.apply_adapters(adapters_of_round(base, round_), SCALE)
    last = adapters_of_round(base, HAND_OVERS - 1)
    weights = dict(engine.model.named_parameters())
    for name, loaded in base.items():
        module = name.removesuffix(".weight")
        expected = fresh_merge(loaded, *last[module]) if module in last else loaded
        assert torch.equal(weights[name], expected), name
    assert len(last) == 7 * 2


def test_merging_and_unmerging_in_place_in_bf16_would_drift_from_the_base():
    """What the hand-over never does (TRL#6688): merge into the live bf16 weight, take it
    out before the next one. After the same hand-overs the weight is not the fresh merge."""
    _, base = bf16_engine()
    name = "model.layers.0.mlp.down_proj.weight"
    live = base[name].clone()
    module = name.removesuffix(".weight")
    for round_ in range(HAND_OVERS):
        a, b = adapters_of_round(base, round_)[module]
        delta = (SCALE * b @ a).to(torch.bfloat16)
        live += delta
        if round_ < HAND_OVERS - 1:
            live -= delta
    expected = fresh_merge(base[name], *adapters_of_round(base, HAND_OVERS - 1)[module])
    drifted = (live != expected).float().mean().item()
    assert drifted > 0.05, f"only {drifted:.1%} of the weights drifted"


def test_a_later_base_load_is_the_base_the_next_adapters_merge_into():
    engine, base = bf16_engine()
    engine.apply_adapters(adapters_of_round(base, 0), SCALE)
    name = "model.layers.1.self_attn.q_proj.weight"
    new_base = torch.randn_like(base[name], dtype=torch.float32).to(torch.bfloat16)
    engine.load_weights([(name, new_base)])
    adapters = adapters_of_round(base, 1)
    engine.apply_adapters(adapters, SCALE)
    weight = dict(engine.model.named_parameters())[name]
    assert torch.equal(weight, fresh_merge(new_base, *adapters[name.removesuffix(".weight")]))
