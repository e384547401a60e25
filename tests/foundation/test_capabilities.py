"""Algorithms, generation engines and model families declare what they support; the
config checks, the planner and the schema's choices read the declarations, not names."""

from __future__ import annotations

import importlib.util

import pytest

from backends.generation import registry
from backends.megatron import families
from mindrl.config import ConfigError, load_config
from mindrl.config.specs import ModelSetupError, gpt_spec, section_hf_config
from trainers.grpo import GRPO
from trainers.registry import get_algorithm

TINY = "configs/tiny.yaml"
MOE = ["model.family=qwen3_moe", "model.num_experts=4", "model.moe_ffn_hidden_size=64"]
NO_VLLM = importlib.util.find_spec("vllm") is None


def problems_of(overrides: list[str], algorithm=None) -> list[str]:
    with pytest.raises(ConfigError) as err:
        load_config(TINY, overrides, algorithm=algorithm or get_algorithm("grpo"))
    return err.value.problems


@pytest.mark.skipif(not NO_VLLM, reason="the message differs where vLLM is installed")
def test_generation_tp_and_ep_on_the_hf_engine_are_refused_together_in_one_line_each():
    problems = problems_of(["rollout.engine=hf", "rollout.tp=2", "rollout.ep=2", *MOE])
    assert problems == [
        "configs/tiny.yaml: rollout.tp=2 needs the vllm engine (rollout.engine is 'hf', vllm "
        "is not installed here): set rollout.engine: vllm, or rollout.tp: 1 for the hf "
        f"engine; {registry.engine_class('vllm').install_hint}",
        "configs/tiny.yaml: rollout.ep=2 needs the vllm engine (rollout.engine is 'hf'; the "
        "hf engine keeps every expert on every rank): set rollout.ep: 1, or rollout.engine: "
        "vllm on GPU / NPU",
    ]


def test_an_expert_group_that_is_not_whole_tp_groups_is_refused():
    problems = problems_of(["rollout.engine=vllm", "rollout.tp=2", "rollout.ep=3", *MOE])
    assert any(
        "rollout.ep=3: a vLLM expert-parallel group is whole TP groups" in p for p in problems
    )


def test_a_vllm_recipe_is_checked_and_planned_where_vllm_is_not_installed():
    # The engine's capabilities are its class attributes, read without importing vLLM.
    vllm = registry.engine_class("vllm")
    assert (vllm.tensor_parallel, vllm.expert_parallel, vllm.preallocates_kv_cache) == (
        True,
        True,
        True,
    )
    config = load_config("configs/qwen3_30b_a3b.yaml", [], algorithm=get_algorithm("grpo"))
    assert (config.rollout.engine, config.rollout.tp, config.rollout.ep) == ("vllm", 4, 4)
    assert registry.is_installed("vllm") is not NO_VLLM


def test_auto_picks_the_installed_engine_ranked_highest(monkeypatch):
    assert registry.engine_name("auto") == ("hf" if NO_VLLM else "vllm")
    monkeypatch.setattr(registry.engine_class("hf"), "auto_rank", 5)
    assert registry.engine_name("auto") == "hf"
    assert registry.engine_name("vllm") == "vllm"  # a named engine is taken as named


def test_a_missing_engine_library_is_named_with_how_to_install_it(monkeypatch):
    monkeypatch.setattr(registry.engine_class("hf"), "library", "no_such_library_here")
    with pytest.raises(registry.EngineUnavailableError, match="needs the 'no_such_library_here'"):
        registry.get_engine_class("hf")
    assert "hf" not in registry.available_engines()


class SequenceRatioGRPO(GRPO):
    """A GRPO variant that declares GSPO's limits (a per-sequence ratio), under its name."""

    name = "seq_grpo"
    supports_partial_rollout = False
    supports_stale_rollouts = False


def test_an_algorithm_is_refused_by_what_it_declares_and_named_by_its_own_name():
    (problem,) = problems_of(["rollout.partial_rollout_budget=2"], SequenceRatioGRPO())
    assert problem == (
        "configs/tiny.yaml: rollout.partial_rollout_budget=2 with --trainer seq_grpo is not yet "
        "supported; remove rollout.partial_rollout_budget for it"
    )
    stale = [
        "rollout.placement=disaggregated", "rollout.devices=1", "rollout.max_staleness=1",
        "actor.parallel.tp=1", "reference.parallel.tp=1", "critic.parallel.tp=1",
    ]  # fmt: skip
    (problem,) = problems_of(stale, SequenceRatioGRPO())
    assert problem.endswith(
        "rollout.placement: disaggregated with --trainer seq_grpo and rollout.max_staleness > 0 "
        "is not yet supported; use rollout.placement: collocated for it"
    )
    assert load_config(TINY, stale, algorithm=get_algorithm("grpo")).rollout.max_staleness == 1


def test_the_schema_offers_the_registered_families_and_engines():
    (problem,) = problems_of(["model.family=gpt2"])
    assert problem == (
        f"configs/tiny.yaml: model.family: 'gpt2' is not one of: {', '.join(families.FAMILIES)}"
    )
    (problem,) = problems_of(["rollout.engine=sglang"])
    assert problem.endswith(f"'sglang' is not one of: auto, {', '.join(registry.ENGINES)}")


def test_a_registered_family_is_a_choice_at_once(monkeypatch):
    class Llama4Family(families.LlamaFamily):
        name = "llama4"

    monkeypatch.setitem(families.FAMILIES, "llama4", Llama4Family())
    assert load_config(TINY, ["model.family=llama4"]).model.family == "llama4"


def test_only_a_multi_latent_attention_family_builds_mla_and_through_its_hf_config():
    config = load_config("configs/tiny_deepseek.yaml", [])
    hf = section_hf_config(config.model)
    assert (hf["model_type"], hf["architectures"]) == ("deepseek_v3", ["DeepseekV3ForCausalLM"])
    assert gpt_spec(config.model).kv_lora_rank == config.model.kv_lora_rank
    llama = load_config(TINY, [])
    assert section_hf_config(llama.model) is None
    llama.model.kv_lora_rank = 16
    with pytest.raises(ModelSetupError, match="built by the deepseek_v3 family only, not 'llama'"):
        gpt_spec(llama.model)


def test_everything_a_config_names_that_is_missing_here_is_reported_together(tmp_path):
    from trainers.driver.setup import RunSetupError, prepare_run

    missing, no_model = tmp_path / "no_model", tmp_path / "no_reward_model"
    overrides = [
        "reward.verifiers=[exact,bogus]",
        f"reward.reward_model={no_model}",
        f"model.hf_path={missing}",
    ]
    config = load_config(TINY, overrides, get_algorithm("grpo"))
    with pytest.raises(RunSetupError) as refused:
        prepare_run(config, "grpo", resume=False)
    assert str(refused.value).splitlines() == [
        "reward.verifiers: unknown verifier 'bogus'; known: exact, math, math_format, synthetic",
        f"reward.reward_model '{no_model}' is not a folder",
        f"model.hf_path '{missing}' is not a folder",
    ]
