"""The embodied loop (collocated GRPO on a vector environment): its advantages and loss
on hand-made batches, the groups' reset states, what it refuses at load, and a short
whole run on the shared Ray cluster."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mindrl.config import ConfigError, load_config
from mindrl.dock import DockClient, create_dock, shutdown_dock
from mindrl.dock.schema import RUN_FIELDS, chunk_step_fields
from mindrl.envs.batched_reach import BatchedReach
from mindrl.envs.demonstrations import record_expert
from mindrl.envs.embodied import VectorEnv
from mindrl.metrics import read_metrics
from mindrl.planner.activations import MicroBatchShape, micro_batch_shape
from mindrl.planner.render import environments_line
from mindrl.planner.report import environments, plan_run_memory, run_sample_flow
from mindrl.run_plan import EMBODIED, build_run_plan
from mindrl.workers.embodied import restarted
from mindrl.workers.episode_rows import (
    ChunkSteps,
    informative_groups,
    reset_state_ids,
    rows_to_put,
)
from trainers.driver.setup import RunSetupError, _preflight
from trainers.driver.train import train
from trainers.registry import get_algorithm

RECIPE = Path(__file__).resolve().parents[2] / "configs" / "embodied_reach.yaml"
GRPO = get_algorithm("grpo")
#: The recipe shrunk to seconds: 16 environments (groups of 4) over 2 ranks, a 2-layer
#: trunk, episodes of 2 chunks of 2 actions.
SMALL = (
    "env.num_envs=16",
    "data.n_samples_per_prompt=4",
    "data.global_batch_size=4",
    "actor.mini_batch_size=2",
    "env.horizon=4",
    "env.chunk_size=2",
    "model.vla.chunk_size=2",
    "model.num_layers=2",
    "model.hidden_size=32",
    "model.ffn_hidden_size=64",
    "model.num_attention_heads=2",
    "model.num_kv_heads=2",
)


def options(*overrides: str):
    return GRPO.resolve(load_config(RECIPE, list(overrides), algorithm=GRPO).algorithm)


def test_grpo_scores_each_episode_against_its_group_of_shared_initial_states():
    returns = torch.tensor([1.0, 0.0, 0.5, 0.5, 2.0, 0.0], dtype=torch.float64)
    groups = torch.tensor([7, 7, 9, 9, 7, 9])  # interleaved groups of three
    scaled = options("algorithm.norm_adv_by_std=true")  # the recipe turns the scaling off
    advantages = GRPO.episode_advantages(returns, groups, scaled)
    first = torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64)  # group 7: mean 1, std 1
    second = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    expected_first = (first - 1.0) / (1.0 + 1e-6)
    expected_second = (second - second.mean()) / (second.std() + 1e-6)
    torch.testing.assert_close(advantages[[0, 1, 4]], expected_first)
    torch.testing.assert_close(advantages[[2, 3, 5]], expected_second)


def test_an_on_policy_chunk_loss_is_minus_the_advantage_per_valid_token_over_the_global_count():
    # Two chunk steps of 2 actions x 2 dims: the second step's last action was never applied.
    logprobs = torch.log(torch.tensor([[0.5, 0.25, 0.5, 0.5], [0.1, 0.2, 0.3, 0.4]]))
    batch = {
        "old_logprob": logprobs.clone(),
        "advantages": torch.tensor([[2.0], [-1.0]]),
        "valid": torch.tensor([[True, True], [True, False]]),
    }
    entropy = torch.ones(2, 4)
    loss, metrics = GRPO.chunk_actor_loss(logprobs, entropy, batch, options(), 2, num_units=12)
    # Valid tokens: 4 with advantage 2, 2 with -1; ratio 1; each weighs 1 / 12.
    assert loss.item() == pytest.approx(-(4 * 2.0 - 2 * 1.0) / 12)
    assert GRPO.valid_units(batch["valid"], options(), 2) == 6
    chunk = options("algorithm.logprob_level=chunk")
    assert GRPO.valid_units(batch["valid"], chunk, 2) == 2
    chunk_loss, chunk_metrics = GRPO.chunk_actor_loss(logprobs, entropy, batch, chunk, 2, 2)
    assert chunk_loss.item() == pytest.approx(-(2.0 - 1.0) / 2)
    # A chunk's entropy sums all its tokens (the policy drew them all, applied or not).
    assert chunk_metrics["entropy"].item() == pytest.approx(4.0)
    assert metrics["entropy"].item() == pytest.approx(1.0)


def test_a_ratio_far_from_one_is_clipped_per_chunk_at_the_chunk_level():
    old = torch.zeros(1, 4)
    new = torch.full((1, 4), 0.25)  # chunk ratio e^1, each token's e^0.25
    batch = {"old_logprob": old, "advantages": torch.tensor([[1.0]]), "valid": torch.ones(1, 2) > 0}
    chunk_loss, metrics = GRPO.chunk_actor_loss(
        new, torch.zeros(1, 4), batch, options("algorithm.logprob_level=chunk"), 2, 1
    )
    assert chunk_loss.item() == pytest.approx(-1.2)  # clipped at 1 + clip_high
    assert metrics["clip_fraction"].item() == 1.0


PPO = get_algorithm("ppo")


def ppo_options(*overrides: str):
    return PPO.resolve(load_config(RECIPE, list(overrides), algorithm=PPO).algorithm)


def test_ppo_credits_each_chunk_step_with_its_return_to_go_bootstrapped_where_cut_off():
    # Episode 0 ran all 3 chunk steps and was cut off by the horizon (bootstrap 0.5);
    # episode 1 terminated at its second step (bootstrap ignored: nothing follows).
    # Chunks of two actions: a chunk's reward is its applied actions' sum.
    rewards = torch.tensor(
        [[[1.0, 0.0], [0.0, 0.0], [1.5, 0.5]], [[0.25, 0.25], [1.0, 0.0], [0.0, 0.0]]],
        dtype=torch.float64,
    )
    values = torch.tensor([[0.2, 0.4, 0.6], [0.1, 0.3, 0.9]], dtype=torch.float64).unsqueeze(-1)
    valid = torch.tensor([[True, True, True], [True, True, False]]).unsqueeze(-1).expand(2, 3, 2)
    bootstrap = torch.tensor([0.5, 0.0], dtype=torch.float64)
    options = ppo_options("algorithm.gamma=1.0", "algorithm.lam=1.0")
    advantages, returns = PPO.chunk_step_advantages(rewards, values, valid, bootstrap, options)
    expected = torch.tensor([[3.5, 2.5, 2.5], [1.5, 1.0, 0.0]], dtype=torch.float64).unsqueeze(-1)
    torch.testing.assert_close(returns, expected)
    steps = valid[..., :1]
    raw = (expected - values)[steps]  # lam 1: the return minus the value (the recipe's)
    torch.testing.assert_close(advantages[steps], raw)
    assert advantages[1, 2, 0] == 0
    whitened = ppo_options("algorithm.lam=1.0", "algorithm.norm_adv_by_std=true")
    advantages, _ = PPO.chunk_step_advantages(rewards, values, valid, bootstrap, whitened)
    torch.testing.assert_close(advantages[steps], (raw - raw.mean()) / raw.std())


def test_ppo_discounts_the_bootstrap_as_the_step_after_the_last():
    zeros = torch.zeros(1, 2, 1, dtype=torch.float64)
    options = ppo_options("algorithm.gamma=0.9", "algorithm.lam=1.0")
    _, returns = PPO.chunk_step_advantages(
        zeros, zeros, torch.ones(1, 2, 1, dtype=torch.bool), torch.tensor([1.0]), options
    )
    torch.testing.assert_close(returns, torch.tensor([[[0.81], [0.9]]], dtype=torch.float64))


def test_ppo_at_the_action_level_credits_every_applied_action_with_its_own_return():
    # Two chunk steps of two actions each, a value per action, gamma 0.5 per action.
    # Episode 0 was cut off (bootstrap 1.0); episode 1 terminated at its third action:
    # its fourth was never applied, so its reward (9) counts nowhere.
    rewards = torch.tensor(
        [[[1.0, 0.0], [0.0, 2.0]], [[0.5, 1.0], [4.0, 9.0]]], dtype=torch.float64
    )
    values = torch.tensor([[[0.1, 0.2], [0.3, 0.4]], [[0.5, 0.6], [0.7, 0.8]]], dtype=torch.float64)
    valid = torch.tensor([[[True, True], [True, True]], [[True, True], [True, False]]])
    bootstrap = torch.tensor([1.0, 0.0], dtype=torch.float64)
    options = ppo_options(
        "algorithm.reward_level=action",
        "algorithm.logprob_level=action",
        "algorithm.gamma=0.5",
        "algorithm.lam=1.0",
    )
    advantages, returns = PPO.chunk_step_advantages(rewards, values, valid, bootstrap, options)
    # Return-to-go per action: r + 0.5 * next; episode 0's last adds 0.5 * bootstrap.
    expected = torch.tensor(
        [[[1.3125, 0.625], [1.25, 2.5]], [[2.0, 3.0], [4.0, 0.0]]], dtype=torch.float64
    )
    torch.testing.assert_close(returns, expected)
    torch.testing.assert_close(advantages[valid], (expected - values)[valid])
    assert advantages[1, 1, 1] == 0


def test_with_chunks_of_one_action_ppo_credits_the_action_level_as_the_chunk_level():
    generator = torch.Generator().manual_seed(3)
    rewards = torch.rand(4, 5, 1, generator=generator, dtype=torch.float64)
    values = torch.rand(4, 5, 1, generator=generator, dtype=torch.float64)
    valid = torch.arange(5).expand(4, 5).unsqueeze(-1) < torch.tensor([5, 3, 1, 4])[:, None, None]
    bootstrap = torch.rand(4, generator=generator, dtype=torch.float64)
    at = {
        level: PPO.chunk_step_advantages(
            rewards,
            values,
            valid,
            bootstrap,
            ppo_options(f"algorithm.reward_level={level}", f"algorithm.logprob_level={level}"),
        )
        for level in ("chunk", "action")
    }
    for chunk_result, action_result in zip(at["chunk"], at["action"], strict=True):
        assert torch.equal(chunk_result, action_result)


def test_ppo_trains_the_embodied_recipe_on_the_actor_alone_with_a_shared_value_head():
    plan = build_run_plan(PPO, load_config(RECIPE, algorithm=PPO))
    assert plan.model_roles == ("actor",) and not plan.needs_critic
    with pytest.raises(ConfigError, match="not built for them"):
        load_config(RECIPE, algorithm=get_algorithm("pf_ppo"))


def test_groups_get_the_same_reset_states_however_the_environments_are_split_over_ranks():
    whole = reset_state_ids(0, 16, 4, groups=4, iteration=3)
    halves = [reset_state_ids(first, 8, 4, groups=4, iteration=3) for first in (0, 8)]
    np.testing.assert_array_equal(np.concatenate(halves), whole)
    assert whole.tolist() == [12] * 4 + [13] * 4 + [14] * 4 + [15] * 4
    assert not set(whole) & set(reset_state_ids(0, 16, 4, groups=4, iteration=4))


def test_cloning_restarts_an_ended_episode_and_keeps_the_live_ones():
    env = BatchedReach(num_envs=8, chunk_size=4, horizon=12, auto_reset=False, seed=5)
    env.reset()
    expert = env.expert_actions()
    expert[4:] = 0.0  # the last four stay at the centre: their episodes go on
    observations, _, terminations, truncations, _ = env.chunk_step(expert)
    ended = np.flatnonzero((terminations | truncations).any(axis=1))
    assert ended.tolist() == [0, 1, 2, 3]  # the expert reaches any target within one chunk
    fresh = restarted(env, observations, ended)
    np.testing.assert_array_equal(fresh.states[ended], 0.0)  # new episodes start at the centre
    np.testing.assert_array_equal(fresh.images[4:], observations.images[4:])
    assert not np.array_equal(fresh.images[ended], observations.images[ended])
    _, _, _, _, info = env.chunk_step(env.expert_actions())
    assert info["valid"][:, 0].all()  # the restarted episodes act again


def test_the_recipes_plan_runs_the_episodes_and_the_update_on_the_actor_alone():
    config = load_config(RECIPE, algorithm=GRPO)
    plan = build_run_plan(GRPO, config)
    assert (plan.runner, plan.mode, plan.model_roles) == (EMBODIED, "collocated", ("actor",))
    # The rollout puts each chunk step into the dock; the update claims them.
    step = ("images", "states", "prompt_ids", "response_ids", "rollout_logprob", "action_valid")
    assert [(s.name, s.role, s.reads, s.writes) for s in plan.stages] == [
        ("rollout", "actor", (), (*step, "advantages")),
        ("update", "actor", (*step, "advantages"), ()),
    ]
    env = config.env
    chunk_steps = env.horizon // env.chunk_size * env.num_envs
    assert plan.dock_groups * plan.group_size == chunk_steps
    ppo = build_run_plan(PPO, load_config(RECIPE, algorithm=PPO)).stage("update")
    assert ppo.reads == (*step, "advantages", "values", "returns")


def test_the_plan_sizes_the_policy_generating_with_its_training_model_and_chunk_step_rows():
    config = load_config(RECIPE, algorithm=GRPO)
    plan = build_run_plan(GRPO, config)
    assert plan.generates and not plan.has_generation_engine
    memory = plan_run_memory(config, plan, device_bytes=16 * 2**30)
    assert memory.generation_naive is None and memory.rollout is None  # no KV cache, no swap
    vla, env = config.model.vla, config.env
    # 64 environments x 6 chunk steps over 2 ranks and 2 optimizer steps: 96 rows a step,
    # in micro-batches of 64; a row is the prefix, the instruction and the action inputs.
    rows = env.num_envs * (env.horizon // env.chunk_size) // 2 // 2
    assert micro_batch_shape(config, config.actor) == MicroBatchShape(
        rows=min(config.actor.micro_batch_size, rows),
        seq=(vla.image_size // vla.patch_size) ** 2 + vla.keypoints + 1
        + config.rollout.max_prompt_length + vla.chunk_size * vla.action_dims - 1,
        logit_positions=min(config.actor.micro_batch_size, rows) * vla.chunk_size * vla.action_dims,
    )  # fmt: skip


def test_the_dry_run_counts_each_chunk_step_into_and_out_of_the_dock_at_its_fields_sizes():
    config = load_config(RECIPE, algorithm=GRPO)
    flow = run_sample_flow(config, build_run_plan(GRPO, config))
    vla, env = config.model.vla, config.env
    actions = vla.chunk_size * vla.action_dims
    image, state = vla.image_size**2 * 3, vla.state_dim * 4  # uint8 pixels, float32 state
    instruction = config.rollout.max_prompt_length * 8  # int64 ids
    chunk = actions * (8 + 4) + vla.chunk_size + 4  # ids, log-probs, valid, one advantage
    chunk_steps = env.horizon // env.chunk_size * env.num_envs
    assert flow.central_bytes == 2 * chunk_steps * (image + state + instruction + chunk)
    assert flow.controllers == 2 and flow.dock_endpoint_bytes > flow.central_bytes


@pytest.mark.parametrize(
    ("placement", "workers", "where"),
    [
        ("collocated", 0, "stepped in the actor ranks' own processes"),
        ("hybrid", 2, "stepped by 2 environment worker(s), one beside each actor rank"),
        ("disaggregated", 2, "stepped by 2 environment worker(s) on CPUs reserved apart"),
    ],
)
def test_the_dry_run_says_where_the_simulators_step_and_how_many_workers_that_takes(
    placement, workers, where
):
    config = load_config(RECIPE, [f"env.placement={placement}"], algorithm=GRPO)
    envs = environments(config, build_run_plan(GRPO, config))
    assert (envs["placement"], envs["env_workers"], envs["per_rank"]) == (placement, workers, 32)
    assert where in environments_line(envs)


@pytest.mark.parametrize(
    ("trainer", "overrides", "line"),
    [
        ("reinforce_pp", (), "--trainer reinforce_pp: embodied runs train group algorithms"),
        ("grpo", ("rollout.placement=disaggregated", "rollout.devices=1"), "runs collocated"),
        ("grpo", ("env.auto_reset=true",), "set env.auto_reset=false"),
        ("grpo", ("algorithm.reward_level=action",), "algorithm.reward_level=action is not"),
        ("grpo", ("algorithm.kl_coef=0.01",), "set algorithm.kl_coef=0"),
        ("grpo", ("data.global_batch_size=4",), "data.global_batch_size=4: an embodied"),
        ("grpo", ("env.num_envs=60",), "env.num_envs=60 is not a whole number of groups"),
        ("grpo", ("env.num_envs=8", "data.global_batch_size=1"), "splits a group"),
        ("grpo", ("model.vla.chunk_size=2",), "model.vla.chunk_size=2 differs"),
        ("grpo", ("model.family=llama",), "set model.family=vla (got llama)"),
        ("grpo", ("env.pipeline_stages=3",), "env.pipeline_stages=3 does not divide a rank's 32"),
        ("grpo", ("env.clone_state_range=true", "env.clone_steps=0"), "it needs env.clone_steps"),
        ("grpo", ("env.clone_data=d.npz", "env.clone_steps=0"), "is cloned in env.clone_steps"),
    ],
)
def test_what_the_embodied_loop_does_not_build_is_refused_in_one_line(trainer, overrides, line):
    with pytest.raises(ConfigError) as err:
        load_config(RECIPE, list(overrides), algorithm=get_algorithm(trainer))
    assert len([p for p in err.value.problems if line in p]) == 1, err.value.problems


@pytest.mark.parametrize(
    ("override", "line"),
    [
        ("model.vla.state_dim=3", "model.vla.state_dim=3 but BatchedReach has 2; set "),
        ("model.vla.image_size=16", "model.vla.image_size=16 but BatchedReach has 32; set "),
        ("model.vocab_size=260", "set model.vocab_size >= 262"),
    ],
)
def test_a_policy_that_does_not_fit_the_environment_is_refused_at_start_up(override, line):
    config = load_config(RECIPE, [override, "model.vla.patch_size=4"], algorithm=GRPO)
    with pytest.raises(RunSetupError, match=line.replace(".", r"\.")):
        _preflight(config, offline=False)
    _preflight(load_config(RECIPE, algorithm=GRPO), offline=False)  # the recipe fits


class ExpertlessReach(BatchedReach):
    """BatchedReach as a simulator without a scripted expert."""

    expert_actions = VectorEnv.expert_actions


def test_demonstrations_that_do_not_fit_the_environment_are_refused_at_start_up(tmp_path):
    path = tmp_path / "demos.npz"
    np.savez(path, states=np.zeros((4, 3)), actions=np.zeros((4, 4, 2)))  # BatchedReach: 2
    config = load_config(RECIPE, [f"env.clone_data={path}"], algorithm=GRPO)
    with pytest.raises(RunSetupError, match=r"states is \[4, 3\]; this run reads \[4, 2\]"):
        _preflight(config, offline=False)


def test_cloning_an_environment_without_a_scripted_expert_is_refused_at_start_up():
    expertless = f"env.cls={__name__}:ExpertlessReach"
    config = load_config(RECIPE, [expertless, "env.clone_steps=5"], algorithm=GRPO)
    with pytest.raises(RunSetupError, match="ExpertlessReach has no scripted expert"):
        _preflight(config, offline=False)
    _preflight(load_config(RECIPE, [expertless, "env.clone_steps=0"], algorithm=GRPO), False)


#: Where the environments step: in the actor's ranks, or in an environment worker beside
#: each, whole or split into two pipeline stages.
PLACEMENTS = {
    "collocated": ("env.placement=collocated", "checkpoint.every=1"),
    "hybrid-1": ("env.placement=hybrid",),
    "hybrid-2": ("env.placement=hybrid", "env.pipeline_stages=2"),
}
#: The collocated run resumed from its checkpoint after iteration 0, its simulators now
#: in the run's own group of environment workers (one whole run tests both).
RESUMED = "resumed"
DISAGGREGATED_2 = ("env.placement=disaggregated", "env.pipeline_stages=2")
#: The same small run with PPO at the action level (GAE over every action from the
#: policy's value head, one value per action) cloned first from recorded demonstrations,
#: and with DAPO (its dynamic sampling: the success-rate filter), one iteration, no cloning.
PPO_RUN, DAPO_RUN = "ppo", "dapo"
ACTION_LEVEL = ("algorithm.reward_level=action", "algorithm.logprob_level=action")


@pytest.fixture(scope="module")
def placed_runs(tmp_path_factory, ray_cluster) -> dict[str, list[dict]]:
    """Two iterations (3 cloning steps first) of the small recipe in each placement:
    their records."""
    root, records = tmp_path_factory.mktemp("embodied"), {}
    for name, placement in PLACEMENTS.items():
        overrides = [
            f"logging.dir={root / name}",
            "logging.progress_bar=false",
            "logging.backends=[]",
            "iterations=2",
            "env.clone_steps=3",
            "env.clone_state_range=true",
            *SMALL,
            *placement,
        ]
        assert train(load_config(RECIPE, overrides, algorithm=GRPO), "grpo", "cpu") == 0
        records[name] = read_metrics(root / name / "metrics.jsonl")
    first = sorted((root / "collocated" / "checkpoints" / "actor").glob("step_*"))[0]
    overrides = [
        f"logging.dir={root / RESUMED}", "logging.progress_bar=false", "logging.backends=[]",
        "iterations=2", "env.clone_steps=3", "env.clone_state_range=true", *SMALL,
        *DISAGGREGATED_2,
    ]  # fmt: skip
    config = load_config(RECIPE, overrides, algorithm=GRPO)
    assert train(config, "grpo", "cpu", resume=str(first)) == 0
    records[RESUMED] = read_metrics(root / RESUMED / "metrics.jsonl")
    demonstrations = root / "reach_demonstrations.npz"
    expert = BatchedReach(num_envs=4, chunk_size=2, horizon=4, auto_reset=True, seed=5)
    np.savez(demonstrations, **record_expert(expert, episodes=6, images=True))
    # PPO starts from 3 cloning steps on those recorded demonstrations, DAPO from scratch.
    cloned = (f"env.clone_data={demonstrations}", "env.clone_steps=3", "env.clone_batch=8")
    for name, iterations in ((PPO_RUN, 2), (DAPO_RUN, 1)):
        overrides = [
            f"logging.dir={root / name}",
            "logging.progress_bar=false",
            "logging.backends=[]",
            f"iterations={iterations}",
            "env.clone_steps=0",
            *SMALL,
            *((*ACTION_LEVEL, *cloned) if name == PPO_RUN else ()),
        ]
        algorithm = get_algorithm(name)
        assert train(load_config(RECIPE, overrides, algorithm=algorithm), name, "cpu") == 0
        records[name] = read_metrics(root / name / "metrics.jsonl")
    return records


@pytest.mark.ray
def test_ppo_trains_the_policy_and_its_value_head_together_at_the_action_level(placed_runs):
    first = placed_runs[PPO_RUN][0]  # after 3 steps on the recorded demonstrations
    assert "clone" in first["time"] and np.isfinite(first["clone_nll_last"])
    for record in placed_runs[PPO_RUN]:
        assert record["grad_norm"] > 0 and np.isfinite(record["pg_loss"])
        assert record["value_loss"] > 0 and np.isfinite(record["value_mean"])
        assert 0.0 <= record["success_rate"] <= 1.0 and record["episodes"] == 16


@pytest.mark.ray
def test_dapo_drops_the_groups_without_both_a_success_and_a_failure(placed_runs):
    (record,) = placed_runs[DAPO_RUN]
    assert 0 <= record["groups_dropped"] <= 4  # 16 environments in groups of 4
    # A random policy rarely succeeds: where every group was dropped, the update still
    # ran on every rank (no hang) and moved nothing.
    if record["groups_dropped"] == 4:
        assert record["grad_norm"] == 0 and record["pg_loss"] == 0
    else:
        assert record["grad_norm"] > 0


def chunk_steps_of(rows: int, generator: torch.Generator) -> ChunkSteps:
    """``rows`` chunk steps of 8x8 images, 3 state dimensions, 2-word instructions and
    chunks of 2 actions of 3 dimensions, each figure drawn at random."""

    def floats(*shape: int) -> torch.Tensor:
        return torch.randn(rows, *shape, generator=generator)

    return ChunkSteps(
        images=torch.randint(0, 256, (rows, 8, 8, 3), generator=generator, dtype=torch.uint8),
        states=floats(3),
        prompt_ids=torch.randint(0, 40, (rows, 2), generator=generator),
        action_ids=torch.randint(0, 256, (rows, 6), generator=generator),
        logprobs=floats(6),
        rewards=floats(2),
        valid=torch.rand(rows, 2, generator=generator) > 0.3,
        values=floats(2),
        advantages=floats(2),
        returns=floats(2),
        kept=torch.rand(rows, generator=generator) > 0.2,
    )


@pytest.mark.ray
def test_chunk_steps_come_back_from_the_dock_as_they_were_put(ray_cluster):
    """Each chunk step is a dock sample: what the update fetches is the rollout's rows,
    an action of a dropped group no longer valid, the figures the dock's float32."""
    steps = chunk_steps_of(12, torch.Generator().manual_seed(3))
    fields = chunk_step_fields(value_head=True)
    handle = create_dock(RUN_FIELDS, {"rollout": [], "update": list(fields)}, 16, timeout_s=20)
    try:
        dock = DockClient(handle)
        indexes = np.arange(4, 16)
        dock.put(indexes, steps.dock_fields(value_head=True))
        (claimed,) = dock.claim("update", list(fields), 12)
        assert sorted(claimed.tolist()) == indexes.tolist()
        back = ChunkSteps.from_dock(dock.fetch(indexes, list(fields)), (8, 8, 3))
    finally:
        shutdown_dock(handle)
    for name in ("images", "prompt_ids", "action_ids"):
        assert torch.equal(getattr(back, name), getattr(steps, name)), name
    for name in ("states", "logprobs", "values", "advantages", "returns"):
        assert torch.equal(getattr(back, name), getattr(steps, name).float()), name
    assert torch.equal(back.valid, steps.valid & steps.kept.unsqueeze(-1))
    assert back.kept.all() and len(back.rewards) == 0


def test_ranks_put_their_live_chunk_steps_and_as_few_others_as_split_them_evenly():
    live = {0: [True, True, False, True], 1: [False, True, False, True]}
    counts = [3, 2]  # 5 live rows do not split over 2 ranks: rank 0 gives one more
    put = {r: rows_to_put(torch.tensor(rows), counts, r).tolist() for r, rows in live.items()}
    assert put == {0: [True, True, True, True], 1: [False, True, False, True]}
    # A rank without a spare row leaves it to the next; counts that split need none.
    full, sparse = torch.tensor([True] * 4), torch.tensor([False, False, True, False])
    assert rows_to_put(full, [4, 1], 0).tolist() == [True] * 4
    assert rows_to_put(sparse, [4, 1], 1).tolist() == [True, False, True, False]
    assert rows_to_put(sparse, [3, 1], 1).tolist() == sparse.tolist()


def test_a_group_is_informative_only_with_both_a_success_and_a_failure():
    success = np.array([1, 0, 1, 1, 0, 0, 1, 0], dtype=bool)
    groups = np.array([5, 5, 7, 7, 9, 9, 3, 3])  # mixed, all succeeded, all failed, mixed
    kept = informative_groups(success, groups)
    assert kept.tolist() == [True, True, False, False, False, False, True, True]


@pytest.mark.ray
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_two_iterations_of_the_embodied_recipe_clone_train_and_record_success(
    placed_runs, placement
):
    records = placed_runs[placement]
    assert len(records) == 2
    for record in records:
        assert 0.0 <= record["success_rate"] <= 1.0
        assert record["episodes"] == 16
        assert 1 <= record["episode_length_mean"] <= 4
        assert record["grad_norm"] > 0 and np.isfinite(record["pg_loss"])
        assert record["entropy"] > 0
        assert record["env_s"] > 0 and record["generate_s"] > 0
        assert record["env_frames_per_s"] > record["epoch_frames_per_s"] > 0
        # Every chunk step with a valid action went through the dock (the first chunk
        # of each of the 16 episodes at least), in a number the 2 ranks split evenly.
        assert 16 <= record["chunk_steps"] <= 32 and record["chunk_steps"] % 2 == 0
    # The behaviour-cloned start runs once, before the first rollout.
    assert set(records[0]["time"]) == {"clone", "rollout", "update"}
    assert set(records[1]["time"]) == {"rollout", "update"}
    assert records[0]["clone_nll_last"] > 0 and np.isfinite(records[0]["clone_nll_first"])
    assert "clone_nll_last" not in records[1]


@pytest.mark.ray
@pytest.mark.parametrize("placement", ["hybrid-1", "hybrid-2"])
def test_where_the_environments_step_changes_no_figure_of_the_run(placed_runs, placement):
    """Sampling noise is drawn per environment and the stages step one simulator's
    trajectories: the clone, the episodes and the updates are those of the collocated run."""
    for mine, reference in zip(placed_runs[placement], placed_runs["collocated"], strict=True):
        for key in ("success_rate", "reward_mean", "episode_length_mean"):
            assert mine[key] == reference[key], key
        for key in ("pg_loss", "grad_norm", "entropy", "clone_nll_first", "clone_nll_last"):
            if key in reference:
                # float32 forwards over batches of other sizes: rounding, no more
                assert mine[key] == pytest.approx(reference[key], rel=1e-5, abs=1e-8), key


@pytest.mark.ray
def test_a_resumed_embodied_run_continues_as_the_uninterrupted_one_wherever_it_steps(
    placed_runs,
):
    """The checkpoint after iteration 0 holds the cloned weights, the optimizer and the
    state normalisation fitted before cloning: the resumed run does not clone again and
    its iteration 1 is the uninterrupted run's, though its simulators now step in the
    run's own (disaggregated) environment workers, two pipeline stages each."""
    (resumed,) = placed_runs[RESUMED]
    expected = placed_runs["collocated"][1]
    assert resumed["iteration"] == 1 and "clone" not in resumed["time"]
    for key in ("success_rate", "reward_mean", "episode_length_mean"):
        assert resumed[key] == expected[key], key
    for key in ("pg_loss", "grad_norm", "entropy"):
        assert resumed[key] == pytest.approx(expected[key], rel=1e-6, abs=1e-9), key


@pytest.mark.ray
def test_each_pipeline_stage_reports_its_simulator_and_generation_seconds(placed_runs):
    record = placed_runs["hybrid-2"][1]
    for figure in ("env_s", "generate_s"):
        stages = record[f"{figure}_0"] + record[f"{figure}_1"]
        assert record[figure] == pytest.approx(stages)
        assert record[f"{figure}_0"] > 0 and record[f"{figure}_1"] > 0
