"""An embodied run's episodes and updates on the actor's ranks (collocated placement).

Each data-parallel rank holds the vision-language-action policy (its Megatron engine)
and its share of the run's vector environments: ``env.num_envs / dp`` of them, numbered
from ``dp_rank * num_envs / dp`` (``first_env_id``), so every environment draws the same
initial states and sampling noise however the environments are split. An iteration:

1. **Rollout.** Every environment is reset; the ``data.n_samples_per_prompt``
   environments of one group share a reset state id (the iteration's and the group's),
   so they start identical. Then ``horizon / chunk_size`` chunk steps: the policy draws
   a chunk of action tokens per environment (one generator per environment, seeded by
   the run's seed, the iteration and the environment's number), the action tokenizer
   turns them into continuous actions, the environment applies them. Episodes are
   fixed-length (``env.auto_reset: false``): an ended environment's later actions are
   not applied and carry ``valid`` False.
2. **Advantages.** Each episode's return (its valid actions' rewards) is scored by the
   algorithm's group statistics (``Algorithm.episode_advantages``: GRPO normalises by its
   group's mean and std) and weighs every chunk step of the episode; a group never
   straddles ranks (the config check makes ``num_envs / dp`` a multiple of the group).
3. **Update.** ``ppo_epochs`` x mini-batches of ``engine.train_vla_step`` over the rank's
   chunk steps, the loss the algorithm's ``chunk_actor_loss`` at ``logprob_level`` with
   each valid unit weighing ``1 / T``, ``T`` the mini-batch's valid units over every rank.

The episode data never leaves the rank that stepped it: the driver gets scalar figures.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from backends.megatron import MegatronEngine
from backends.megatron.families.vla import (
    ACTION_BINS,
    ActionSampling,
    VLAChunk,
    VLAObservation,
    VLAPolicy,
    VLASpec,
)
from mindrl.algorithm import Algorithm
from mindrl.config.schema import AlgorithmConfig, MindRLConfig
from mindrl.envs.action_tokenizer import ActionTokenizer
from mindrl.envs.embodied import EnvConfigError, Observations, VectorEnv, make_vector_env
from mindrl.metrics.reduce import mean_by_key
from mindrl.workers.updates import minibatch_slices, step_metrics

#: The behaviour-cloning phase's key in the sampling seeds (RL's rollouts have none).
CLONING = 1


@dataclass
class ChunkSteps:
    """One rank's episodes of an iteration, one row per (chunk step, environment),
    step-major: ``images`` uint8 ``[rows, H, W, 3]``, ``states`` ``[rows, S]``,
    ``prompt_ids`` ``[rows, L]``, ``action_ids`` / ``logprobs`` ``[rows, C*A]``
    (generation's), ``rewards`` / ``valid`` ``[rows, C]`` and ``advantages [rows, 1]``
    (the episode's, at the chunk level)."""

    images: torch.Tensor
    states: torch.Tensor
    prompt_ids: torch.Tensor
    action_ids: torch.Tensor
    logprobs: torch.Tensor
    rewards: torch.Tensor
    valid: torch.Tensor
    advantages: torch.Tensor

    def __len__(self) -> int:
        return len(self.action_ids)

    def rows(self, which: slice | torch.Tensor) -> ChunkSteps:
        """The rows ``which`` selects."""
        return ChunkSteps(**{name: value[which] for name, value in vars(self).items()})

    def observation(self) -> VLAObservation:
        return VLAObservation(self.images, self.states, self.prompt_ids)


def reset_state_ids(first_env_id: int, num_envs: int, group_size: int, groups: int, iteration: int):
    """Each environment's reset state id in ``iteration``: its group's (``group_size``
    consecutive environments by global number), new every iteration."""
    global_ids = first_env_id + np.arange(num_envs)
    return iteration * groups + global_ids // group_size


class EmbodiedActor:
    """A rank's environments, and the rollout and update of its share of the episodes
    (module docstring)."""

    def __init__(
        self, config: MindRLConfig, engine: MegatronEngine, dp_rank: int, dp_size: int
    ) -> None:
        env = config.env
        self.config, self.engine = config, engine
        self.group_size = config.data.n_samples_per_prompt
        self.groups = env.num_envs // self.group_size
        per_rank = env.num_envs // dp_size
        self.env: VectorEnv = make_vector_env(
            env.cls,
            num_envs=per_rank,
            chunk_size=env.chunk_size,
            horizon=env.horizon,
            auto_reset=env.auto_reset,
            seed=config.seed,
            first_env_id=dp_rank * per_rank,
            kwargs=env.kwargs,
        )
        self.vla: VLASpec = engine.vla
        check_fits(self.env, self.vla, engine.spec.vocab_size, clones=env.clone_steps > 0)
        spec = self.env.action_spec
        self.actions = ActionTokenizer(engine.spec.vocab_size, ACTION_BINS, spec.low, spec.high)
        top_k = config.rollout.top_k
        self.sampling = ActionSampling(config.rollout.temperature, top_k if top_k > 0 else None)
        self.steps: ChunkSteps | None = None
        self._cloning_observations: Observations | None = None  # between clone_expert calls

    # ---- rollout --------------------------------------------------------------------------
    def rollout(self, iteration: int, algorithm: Algorithm, options: AlgorithmConfig) -> dict:
        """Run one episode in every environment with the current weights, keep its chunk
        steps and their advantages for :meth:`update`; the episodes' sums for the record
        (the driver adds the ranks' sums)."""
        env, policy = self.env, self.engine.vla_policy()
        groups = reset_state_ids(
            env.first_env_id, env.num_envs, self.group_size, self.groups, iteration
        )
        observations = env.reset(reset_state_ids=groups)
        generators = self._generators(iteration)
        recorded, rewards, valid = [], [], []
        success = np.zeros(env.num_envs, dtype=np.bool_)
        for _ in range(env.horizon // env.chunk_size):
            observation = self._observation(observations)
            chunk = policy.generate(observation, self.sampling, generators)
            observations, reward, _, _, info = env.chunk_step(self._actions(chunk))
            recorded.append((observation, chunk))
            rewards.append(torch.from_numpy(reward))
            valid.append(torch.from_numpy(info["valid"]))
            success |= info["success"]
        self.steps = self._steps(recorded, rewards, valid)
        returns = torch.stack(rewards).double().sum(dim=(0, 2))  # [envs]
        advantages = algorithm.episode_advantages(returns, torch.from_numpy(groups), options)
        self.steps.advantages = advantages.repeat(len(recorded)).unsqueeze(-1)
        lengths = torch.stack(valid).sum(dim=(0, 2))
        return {
            "episodes": float(env.num_envs),
            "successes": float(success.sum()),
            "return_sum": float(returns.sum()),
            "length_sum": float(lengths.sum()),
        }

    def _generators(self, iteration: int, *phase: int) -> list[torch.Generator]:
        """One sampling generator per environment, seeded by (seed, iteration, its
        global number, ``phase``: none for RL's rollouts): its draws do not depend on
        which rank steps it."""
        generators = []
        for env_id in range(self.env.first_env_id, self.env.first_env_id + self.env.num_envs):
            seed = np.random.SeedSequence([self.config.seed, iteration, env_id, *phase])
            generators.append(torch.Generator().manual_seed(int(seed.generate_state(1)[0])))
        return generators

    def _observation(self, observations: Observations) -> VLAObservation:
        if observations.instruction_ids is None:
            raise EnvConfigError(
                f"{type(self.env).__name__} gives no instruction_ids; the vla policy reads "
                "the instruction as ids of the environment's own vocabulary"
            )
        dtype = self.engine.spec.torch_dtype
        return VLAObservation(
            images=torch.from_numpy(np.ascontiguousarray(observations.images)),
            states=torch.from_numpy(observations.states).to(dtype),
            prompt_ids=torch.from_numpy(observations.instruction_ids).long(),
        )

    def _actions(self, chunk: VLAChunk) -> np.ndarray:
        """``[envs, C, A]`` continuous actions of the drawn action ids."""
        ids = chunk.action_ids.numpy().reshape(len(chunk.action_ids), -1, self.vla.action_dims)
        return self.actions.ids_to_actions(ids)

    @staticmethod
    def _steps(recorded: list, rewards: list, valid: list) -> ChunkSteps:
        observations = [observation for observation, _ in recorded]
        chunks = [chunk for _, chunk in recorded]
        return ChunkSteps(
            images=torch.cat([o.images for o in observations]),
            states=torch.cat([o.states for o in observations]),
            prompt_ids=torch.cat([o.prompt_ids for o in observations]),
            action_ids=torch.cat([c.action_ids for c in chunks]),
            logprobs=torch.cat([c.logprobs for c in chunks]),
            rewards=torch.cat(rewards),
            valid=torch.cat(valid),
            advantages=torch.zeros(0),
        )

    # ---- a behaviour-cloned start ----------------------------------------------------------
    def clone_expert(self, first: int, count: int, total: int) -> dict[str, float]:
        """Steps ``first .. first + count - 1`` of ``total`` optimizer steps of behaviour
        cloning from the environment's scripted expert, DAgger-style (Ross, Gordon and
        Bagnell 2011): every observation is labelled with the expert's chunk, and at step
        ``k`` each environment acts with the expert's chunk with probability
        ``1 - k / total``, with the policy's own draw otherwise, so the states visited
        move from the expert's towards the policy's. An environment whose episode ended
        starts a new one at once (from its own initial-state stream, never an RL
        group's), so every step learns from live episodes. Returns the mean negative
        log-likelihood of the expert's tokens at the first and last step."""
        env, policy = self.env, self.engine.vla_policy()
        tokens = env.num_envs * self.vla.action_tokens
        (units,) = self.engine.sum_over_data_parallel([torch.tensor(float(tokens))])

        def loss_fn(policy: VLAPolicy, labelled: tuple) -> torch.Tensor:
            return -policy.score(*labelled, self.sampling)["logprobs"].sum() / units

        if first == 0:
            self._cloning_observations = env.reset()
        nll = []
        for step in range(first, first + count):
            observation = self._observation(self._cloning_observations)
            expert = env.expert_actions()
            labels = torch.from_numpy(self.actions.actions_to_ids(expert).reshape(env.num_envs, -1))
            stepped = self.engine.train_vla_step(
                [(observation, labels)], loss_fn, lr=self.config.env.clone_lr
            )
            nll.append(stepped["loss"])
            generators = self._generators(step, CLONING)
            by_expert = np.array([float(torch.rand(1, generator=g)) for g in generators])
            drawn = self._actions(policy.generate(observation, self.sampling, generators))
            actions = np.where((by_expert < 1.0 - step / total)[:, None, None], expert, drawn)
            observations, _, terminations, truncations, _ = env.chunk_step(actions)
            ended = np.flatnonzero((terminations | truncations).any(axis=1))
            self._cloning_observations = restarted(env, observations, ended)
        return {"clone_nll_first": nll[0], "clone_nll_last": nll[-1]} if nll else {}

    # ---- update ---------------------------------------------------------------------------
    def update(
        self,
        algorithm: Algorithm,
        options: AlgorithmConfig,
        epochs: int,
        num_minibatches: int,
        micro_batch_size: int | None,
    ) -> dict[str, float]:
        """``epochs`` x ``num_minibatches`` optimizer steps on the rollout's chunk steps
        (those with a valid action; the others train nothing); the steps' mean metrics."""
        steps = self.steps.rows(self.steps.valid.any(-1))
        self.steps = None
        records = []
        for _ in range(epochs):
            for part in minibatch_slices(len(steps), num_minibatches):
                records.append(self._step(steps.rows(part), algorithm, options, micro_batch_size))
        return mean_by_key(records)

    def _step(
        self,
        mini: ChunkSteps,
        algorithm: Algorithm,
        options: AlgorithmConfig,
        micro_batch_size: int | None,
    ) -> dict[str, float]:
        """One optimizer step on this rank's share ``mini`` of a mini-batch."""
        dims = self.vla.action_dims
        (units,) = self.engine.sum_over_data_parallel(
            [algorithm.valid_units(mini.valid, options, dims)]
        )
        collected: list[dict[str, torch.Tensor]] = []

        def loss_fn(policy: VLAPolicy, micro: ChunkSteps) -> torch.Tensor:
            scored = policy.score(micro.observation(), micro.action_ids, self.sampling)
            like = scored["logprobs"]
            batch = {
                "old_logprob": micro.logprobs.to(like),
                "advantages": micro.advantages.to(like),
                "valid": micro.valid.to(like.device),
            }
            loss, metrics = algorithm.chunk_actor_loss(
                like, scored["entropy"], batch, options, dims, units
            )
            collected.append(metrics)
            return loss

        micro_batches = [mini.rows(s) for s in _micro_slices(len(mini), micro_batch_size)]
        stats = self.engine.train_vla_step(micro_batches, loss_fn)
        dp_size = self.engine.data_parallel_size()
        return {**stats, **step_metrics(collected, algorithm.additive_metrics, dp_size)}


def restarted(env: VectorEnv, observations: Observations, ended: np.ndarray) -> Observations:
    """``observations`` with the environments ``ended`` reset, their rows replaced by
    their new episodes' first observations."""
    if not ended.size:
        return observations
    fresh = env.reset(env_ids=ended)
    images, states = observations.images.copy(), observations.states.copy()
    images[ended], states[ended] = fresh.images, fresh.states
    instructions = list(observations.instructions)
    for row, text in zip(ended, fresh.instructions, strict=True):
        instructions[row] = text
    ids = observations.instruction_ids
    if ids is not None:
        ids = ids.copy()
        ids[ended] = fresh.instruction_ids
    return Observations(images, states, instructions, ids)


def _micro_slices(rows: int, micro_batch_size: int | None) -> list[slice]:
    """Micro-batches of at most ``micro_batch_size`` rows (all rows when None)."""
    size = micro_batch_size or max(rows, 1)
    return [slice(start, start + size) for start in range(0, rows, size)]


def check_fits(env: VectorEnv, vla: VLASpec, vocab_size: int, clones: bool = False) -> None:
    """The environment's observations and actions are what the policy reads and writes,
    and, where the run ``clones`` a scripted expert first, it has one.

    Raises:
        EnvConfigError: one line naming the first mismatch and the setting that fixes it.
    """
    spec, actions = env.observation_spec, env.action_spec
    name = type(env).__name__
    if spec.image_height != spec.image_width:
        raise EnvConfigError(
            f"{name} renders {spec.image_height}x{spec.image_width} images; the vla policy "
            "reads square ones"
        )
    pairs = (
        ("image_size", vla.image_size, spec.image_height),
        ("state_dim", vla.state_dim, spec.state_dim),
        ("action_dims", vla.action_dims, actions.dims),
        ("chunk_size", vla.chunk_size, env.chunk_size),
    )
    for key, policy_value, env_value in pairs:
        if policy_value != env_value:
            raise EnvConfigError(
                f"model.vla.{key}={policy_value} but {name} has {env_value}; set "
                f"model.vla.{key}={env_value}"
            )
    if clones and type(env).expert_actions is VectorEnv.expert_actions:
        env.expert_actions()  # raises its one line: no scripted expert to clone
    words = len(spec.instruction_vocab)
    if words > vocab_size - ACTION_BINS:
        raise EnvConfigError(
            f"{name}'s instructions use {words} words but model.vocab_size={vocab_size} "
            f"leaves {vocab_size - ACTION_BINS} ids before the {ACTION_BINS} action ids; set "
            f"model.vocab_size >= {words + ACTION_BINS}"
        )
