"""``actor.lora``: its defaults, the plan without a reference role, and one-line refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from mindrl.config import ConfigError, load_config
from mindrl.config.schema import LoRAConfig
from mindrl.config.specs import engine_specs
from mindrl.run_plan import build_run_plan
from trainers.registry import get_algorithm

TINY = Path(__file__).parents[2] / "configs" / "tiny.yaml"


def config_for(*overrides: str, trainer: str = "grpo", path: Path | None = None):
    return load_config(path, list(overrides), algorithm=get_algorithm(trainer))


def problems_of(*overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as err:
        config_for(*overrides)
    return err.value.problems


def test_the_default_targets_are_the_four_linears_of_every_layer():
    assert LoRAConfig().targets == ["qkv", "proj", "fc1", "fc2"]


def test_rank_alone_on_tiny_adds_its_output_layer_alpha_twice_the_rank_and_the_adapter_rate():
    config = config_for("actor.lora.rank=8", path=TINY)
    layout = build_run_plan(get_algorithm("grpo"), config).layout.training["actor"]
    specs = engine_specs(config.actor, layout, total_steps=10)
    # The tiny recipe's random-init head must learn too: it names the output layer.
    assert specs.lora.targets == ("qkv", "proj", "fc1", "fc2", "output")
    assert (specs.lora.rank, specs.lora.alpha, specs.lora.dropout) == (8, 16.0, 0.0)
    assert specs.optim.lr == 2e-3  # not optim.lr: the optimizer holds the adapters only
    assert engine_specs(config.actor, layout, total_steps=None).lora is None  # scoring only


def test_without_lora_the_actor_trains_its_full_weights():
    config = config_for()
    layout = build_run_plan(get_algorithm("grpo"), config).layout.training["actor"]
    specs = engine_specs(config.actor, layout, total_steps=10)
    assert specs.lora is None and specs.optim.lr == config.actor.optim.lr


def test_a_lora_actor_with_a_kl_term_places_no_reference_and_scores_it_itself():
    algorithm = get_algorithm("grpo")
    plan = build_run_plan(algorithm, config_for("actor.lora.rank=8", "algorithm.kl_coef=0.01"))
    assert plan.model_roles == ("actor",)
    assert plan.needs_reference and plan.stage("ref_logp").role == "actor"
    assert "ref_logprob" in plan.stage("update").reads
    full = build_run_plan(algorithm, config_for("algorithm.kl_coef=0.01"))
    assert full.model_roles == ("actor", "reference")


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        (
            ["actor.parallel.cp=2"],
            "actor.lora with parallel.cp > 1 is not supported yet; set actor.parallel.cp=1",
        ),
        (["actor.lora.targets=[qkv,experts]"], "MoE experts take no adapters"),
        (["actor.lora.targets=[qkv,gate]"], "actor.lora.targets: unknown 'gate'"),
        (["reference.lora.rank=4"], "reference.lora: only the actor trains adapters"),
        (
            ["actor.lora.targets=[qkv,output]", "model.tie_word_embeddings=true"],
            "actor.lora.targets: 'output' on a model whose output layer is its input embedding",
        ),
    ],
)
def test_what_lora_cannot_do_is_refused_in_one_line_at_load(overrides, problem):
    problems = problems_of("actor.lora.rank=8", *overrides)
    assert any(problem in line for line in problems), problems
