"""An embodied run's episodes and updates on the actor's ranks.

Each data-parallel rank holds the vision-language-action policy (its Megatron engine)
and its share of the run's vector environments: ``env.num_envs / dp`` of them, numbered
from ``dp_rank * num_envs / dp`` (``first_env_id``), so every environment draws the same
initial states and sampling noise however the environments are split. An iteration:

1. **Rollout.** Every environment is reset; the ``data.n_samples_per_prompt``
   environments of one group share a reset state id (the iteration's and the group's),
   so they start identical. Then ``horizon / chunk_size`` chunk steps: the policy draws
   a chunk of action tokens per environment (one generator per environment, seeded by
   the run's seed, the iteration and the environment's number), the action tokenizer
   turns them into continuous actions, the environment applies them, stage after
   stage of its ``env.pipeline_stages`` sub-simulators (mindrl/envs/stages.py), in this
   process or an environment worker beside it (``env.placement``). Episodes are
   fixed-length (``env.auto_reset: false``): an ended environment's later actions are
   not applied and carry ``valid`` False.
2. **Advantages.** Each episode's return (its valid actions' rewards) is scored by the
   algorithm's group statistics (``Algorithm.episode_advantages``: GRPO normalises by its
   group's mean and std) and weighs every chunk step of the episode; a group never
   straddles ranks (the config check makes ``num_envs / dp`` a multiple of the group).
   With a value head (PPO) each chunk step has its own advantage instead
   (``Algorithm.chunk_step_advantages``).
3. **Into the dock.** Each chunk step with a valid action becomes a dock sample
   (``ChunkSteps.dock_fields``): chunk step ``t`` of environment ``e`` at index
   ``t * num_envs + e``, the layout of one whole simulator's rollout whatever the ranks.
   The rank keeps nothing of its episodes after the put.
4. **Update.** The driver claims the samples for the actor's data-parallel ranks (each
   its share, balanced, from its own node's warehouse where it can); each rank fetches
   its share and takes ``ppo_epochs`` x mini-batches of ``engine.train_vla_step`` on it,
   the loss the algorithm's ``chunk_actor_loss`` at ``logprob_level`` with each valid
   unit weighing ``1 / T``, ``T`` the mini-batch's valid units over every rank (plus the
   value head's loss under PPO).

The driver hands out the iteration and the claimed indexes and gets scalar figures back.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

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
from mindrl.config.schema import HYBRID, AlgorithmConfig, MindRLConfig
from mindrl.dock import DockClient
from mindrl.dock.schema import chunk_step_fields
from mindrl.envs.action_tokenizer import ActionTokenizer
from mindrl.envs.demonstrations import Demonstrations, load_demonstrations
from mindrl.envs.embodied import EnvConfigError, Observations
from mindrl.envs.stages import (
    SimulatorStages,
    StageLayout,
    join_observations,
)
from mindrl.metrics.reduce import mean_by_key
from mindrl.workers.embodied_setup import check_fits, start_stages
from mindrl.workers.episode_rows import (
    ChunkSteps,
    SteppedEpisodes,
    informative_groups,
    reset_state_ids,
    rows_to_put,
)
from mindrl.workers.updates import minibatch_slices, step_metrics

#: The behaviour-cloning phase's key in the sampling seeds (RL's rollouts have none).
CLONING = 1


class EmbodiedActor:
    """A rank's environments, and the rollout and update of its share of the episodes
    (module docstring)."""

    def __init__(
        self,
        config: MindRLConfig,
        engine: MegatronEngine,
        dp_rank: int,
        dp_size: int,
        rank: int,
        dock: DockClient,
    ) -> None:
        env = config.env
        self.config, self.engine, self.dock = config, engine, dock
        self.group_size = config.data.n_samples_per_prompt
        self.groups = env.num_envs // self.group_size
        per_rank = env.num_envs // dp_size
        self.env: SimulatorStages = start_stages(
            config,
            StageLayout(per_rank, dp_rank * per_rank, env.pipeline_stages),
            rank,
            engine.device,
        )
        self.vla: VLASpec = engine.vla
        check_fits(
            self.env.description, env.chunk_size, self.vla, engine.spec.vocab_size,
            clones=env.clones_expert,
        )  # fmt: skip
        spec = self.env.description.action_spec
        self.actions = ActionTokenizer(engine.spec.vocab_size, ACTION_BINS, spec.low, spec.high)
        top_k = config.rollout.top_k
        self.sampling = ActionSampling(config.rollout.temperature, top_k if top_k > 0 else None)
        self._cloning_observations: Observations | None = None  # between clone_expert calls
        self._demonstration_set: Demonstrations | None = None  # env.clone_data, once read

    # ---- rollout --------------------------------------------------------------------------
    def rollout(self, iteration: int, algorithm: Algorithm, options: AlgorithmConfig) -> dict:
        """Run one episode in every environment with the current weights and put its
        chunk steps with their advantages into the dock (the data-parallel leader; its
        TP peers stepped the same episodes); the episodes' sums, the samples put
        (``chunk_steps``) and the stages' environment and generation seconds for the
        record (the driver adds the ranks' sums)."""
        env = self.env
        groups = reset_state_ids(
            env.first_env_id, env.num_envs, self.group_size, self.groups, iteration
        )
        with self._rollout_threads():
            stepped = self._pipelined_episodes(groups, self._generators(iteration))
        steps = stepped.chunk_steps()
        per_env = (stepped.chunks, env.num_envs, -1)
        returns = steps.rewards.double().view(per_env).sum(dim=(0, 2))  # [envs]
        dropped = 0
        if algorithm.chunk_value_head:
            self._credit_each_step(steps, stepped, algorithm, options)
        else:
            advantages = algorithm.episode_advantages(returns, torch.from_numpy(groups), options)
            steps.advantages = advantages.repeat(stepped.chunks).unsqueeze(-1)
            if options.dynamic_sampling:  # the success-rate filter
                kept = informative_groups(stepped.success, groups)
                steps.kept = torch.from_numpy(kept).repeat(stepped.chunks)
                dropped = len(np.unique(groups[~kept]))
        lengths = steps.valid.view(per_env).sum(dim=(0, 2))
        put = self._put(steps, algorithm)
        return {
            "chunk_steps": float(put),
            "groups_dropped": float(dropped),
            "episodes": float(env.num_envs),
            "successes": float(stepped.success.sum()),
            "return_sum": float(returns.sum()),
            "length_sum": float(lengths.sum()),
            **stepped.seconds(env),
        }

    def _put(self, steps: ChunkSteps, algorithm: Algorithm) -> int:
        """Put the chunk steps :meth:`_rows_to_put` picks into the dock (the
        data-parallel leader), each at its place in one whole simulator's step-major
        rows (``t * num_envs + env_id``); how many (0 on a TP peer)."""
        envs = self.env.num_envs
        chunk = torch.arange(len(steps)) // envs
        env_ids = self.env.first_env_id + torch.arange(len(steps)) % envs
        rows = self._rows_to_put(steps.valid.any(-1))
        if not self.engine.is_data_leader():
            return 0
        indexes = (chunk * self.config.env.num_envs + env_ids)[rows]
        self.dock.put(indexes.numpy(), steps.rows(rows).dock_fields(algorithm.chunk_value_head))
        return len(indexes)

    def _rows_to_put(self, live: torch.Tensor) -> torch.Tensor:
        """``[rows]``: the chunk steps this rank puts (:func:`rows_to_put` over every
        data-parallel rank's count of rows with a valid action; TP peers join the
        count's all-reduce too)."""
        dp, rank = self.engine.data_parallel_size(), self.engine.data_parallel_rank()
        counts = [float(live.sum()) if r == rank else 0.0 for r in range(dp)]
        counts = self.engine.sum_over_data_parallel(counts)
        return rows_to_put(live, [int(c) for c in counts], rank)

    def _credit_each_step(
        self,
        steps: ChunkSteps,
        stepped: SteppedEpisodes,
        algorithm: Algorithm,
        options: AlgorithmConfig,
    ) -> None:
        """Each chunk step's advantages and the value head's return targets (at
        ``algorithm.reward_level``: one per chunk or per action) from the algorithm's
        per-step estimator (PPO: GAE over the episode's steps, with the value of where an
        episode cut off by its horizon stopped as its bootstrap)."""
        envs = self.env.num_envs
        per_env = (stepped.chunks, envs, -1)  # step-major rows -> [T, envs, ...]

        def by_episode(rows: torch.Tensor) -> torch.Tensor:  # [rows, k] -> [envs, T, k]
            return rows.view(per_env).transpose(0, 1)

        final = join_observations(stepped.last_observations)
        bootstrap = self.engine.vla_policy().values(self._observation(final))[:, 0].double()
        bootstrap[torch.from_numpy(stepped.terminated)] = 0.0
        advantages, returns = algorithm.chunk_step_advantages(
            by_episode(steps.rewards.double()),
            by_episode(steps.values.double()),
            by_episode(steps.valid),
            bootstrap,
            options,
        )
        steps.advantages = advantages.transpose(0, 1).reshape(len(steps), -1)
        steps.returns = returns.transpose(0, 1).reshape(len(steps), -1)

    @contextlib.contextmanager
    def _rollout_threads(self) -> Iterator[None]:
        """Under the hybrid placement the rank's environment worker steps while the rank
        generates: the rank leaves it one of its host threads for the rollout (and
        trains on all of them again after)."""
        threads = torch.get_num_threads()
        if self.config.env.placement == HYBRID:
            torch.set_num_threads(max(1, threads - 1))
        try:
            yield
        finally:
            torch.set_num_threads(threads)

    def _pipelined_episodes(self, groups: np.ndarray, generators: list) -> SteppedEpisodes:
        """Every environment's episode, stage by stage: stage ``s``'s chunk is
        submitted to its simulator, then the policy generates for stage ``s + 1`` while
        that chunk steps (where the stages step in another process: hybrid), and waits
        for stage ``s``'s observations only when its turn comes again."""
        env, policy, layout = self.env, self.engine.vla_policy(), self.env.layout
        pending = [
            env.submit_reset(stage, reset_state_ids=groups[layout.rows(stage)])
            for stage in range(env.count)
        ]
        stepped = SteppedEpisodes(layout, env.horizon // env.chunk_size)
        for chunk_index in range(stepped.chunks + 1):
            for stage in range(env.count):
                answer = pending[stage].result()
                observations = stepped.record_step(stage, answer) if chunk_index else answer
                if chunk_index == stepped.chunks:
                    continue
                observation = self._observation(observations)
                start = time.perf_counter()
                chunk = policy.generate(observation, self.sampling, generators[layout.rows(stage)])
                stepped.generate_s[stage] += time.perf_counter() - start
                stepped.recorded[stage].append((observation, chunk))
                pending[stage] = env.submit_step(stage, self._actions(chunk))
        return stepped

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
        # torch.tensor copies: an environment worker's arrays arrive read-only.
        return VLAObservation(
            images=torch.tensor(observations.images),
            states=torch.tensor(observations.states, dtype=dtype),
            prompt_ids=torch.tensor(observations.instruction_ids, dtype=torch.long),
        )

    def _actions(self, chunk: VLAChunk) -> np.ndarray:
        """``[envs, C, A]`` continuous actions of the drawn action ids."""
        ids = chunk.action_ids.numpy().reshape(len(chunk.action_ids), -1, self.vla.action_dims)
        return self.actions.ids_to_actions(ids)

    # ---- a behaviour-cloned start ----------------------------------------------------------
    def clone_expert(self, first: int, count: int, total: int) -> dict[str, float]:
        """Steps ``first .. first + count - 1`` of ``total`` optimizer steps of behaviour
        cloning: from ``env.clone_data``'s demonstrations where the run names a file
        (:meth:`_clone_demonstrations`), else from the environment's scripted expert,
        DAgger-style (Ross, Gordon and
        Bagnell 2011): every observation is labelled with the expert's chunk, and at step
        ``k`` each environment acts with the expert's chunk with probability
        ``1 - k / total``, with the policy's own draw otherwise, so the states visited
        move from the expert's towards the policy's. An environment whose episode ended
        starts a new one at once (from its own initial-state stream, never an RL
        group's), so every step learns from live episodes. With
        ``env.clone_state_range`` the policy's state normalisation is first fitted to
        the expert's episodes (:meth:`_fit_state_range`). Returns the mean negative
        log-likelihood of the expert's tokens at the first and last step."""
        if self.config.env.clone_data:
            return self._clone_demonstrations(first, count)
        env, policy = self.env, self.engine.vla_policy()
        tokens = env.num_envs * self.vla.action_tokens
        (units,) = self.engine.sum_over_data_parallel([torch.tensor(float(tokens))])
        loss_fn = self._cloning_loss(units)
        if first == 0:
            if self.config.env.clone_state_range:
                self._fit_state_range()
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
        return cloning_record(nll)

    def _clone_demonstrations(self, first: int, count: int) -> dict[str, float]:
        """Optimizer steps ``first .. first + count - 1`` on shuffled batches of
        ``env.clone_batch`` demonstration pairs (each rank its share of the same batch),
        the loss their action tokens' mean NLL (RLinf-VLA's SFT start). With
        ``env.clone_state_range`` the state normalisation is the demonstrations' range."""
        demos, env = self._demonstrations(), self.config.env
        if first == 0 and env.clone_state_range:
            states = torch.from_numpy(demos.states).double()
            self.engine.vla_policy().set_state_range(states.amin(dim=0), states.amax(dim=0))
        rank, ranks = self.engine.data_parallel_rank(), self.engine.data_parallel_size()
        loss_fn = self._cloning_loss(min(env.clone_batch, len(demos)) * self.vla.action_tokens)
        nll = []
        for step in range(first, first + count):
            rows = demos.batch_rows(step, self.config.seed, env.clone_batch, rank, ranks)
            labelled = self._demonstration_batch(demos, rows)
            stepped = self.engine.train_vla_step([labelled], loss_fn, lr=env.clone_lr)
            nll.append(stepped["loss"])
        return cloning_record(nll)

    def _cloning_loss(self, units: float) -> Callable[[VLAPolicy, tuple], torch.Tensor]:
        """A cloning step's loss on a labelled micro-batch ``(observation, action ids)``:
        its tokens' NLL under the rollout's sampling, over ``units``, the step's tokens
        on every rank (so the step's loss is their mean however the batch is split)."""

        def loss_fn(policy: VLAPolicy, labelled: tuple) -> torch.Tensor:
            return -policy.score(*labelled, self.sampling)["logprobs"].sum() / units

        return loss_fn

    def _demonstrations(self) -> Demonstrations:
        """``env.clone_data``, loaded once and checked against this run's environment;
        pairs without instruction ids carry the environment's one instruction."""
        if self._demonstration_set is None:
            spec = self.env.description.observation_spec
            env = self.config.env
            demos = load_demonstrations(env.clone_data, spec, env.chunk_size, self.vla.action_dims)
            if demos.instruction_ids is None:
                ids = self.env.reset().instruction_ids
                if ids is None or (ids != ids[:1]).any():
                    raise EnvConfigError(
                        f"env.clone_data={env.clone_data!r} has no instruction_ids and "
                        f"{self.env.description.name}'s instructions differ between episodes; "
                        "save each pair's instruction_ids with the demonstrations"
                    )
                demos = replace(demos, instruction_ids=np.repeat(ids[:1], len(demos), axis=0))
            self._demonstration_set = demos
        return self._demonstration_set

    def _demonstration_batch(
        self, demos: Demonstrations, rows: np.ndarray
    ) -> tuple[VLAObservation, torch.Tensor]:
        """The policy's observation of demonstration pairs ``rows`` and their chunks'
        action ids (blank images where the file has none)."""
        spec = self.env.description.observation_spec
        if demos.images is None:
            images = np.zeros((len(rows), spec.image_height, spec.image_width, 3), np.uint8)
        else:
            images = demos.images[rows]
        observation = VLAObservation(
            images=torch.from_numpy(images),
            states=torch.from_numpy(demos.states[rows]),
            prompt_ids=torch.from_numpy(demos.instruction_ids[rows].astype(np.int64)),
        )
        ids = self.actions.actions_to_ids(demos.actions[rows]).reshape(len(rows), -1)
        return observation, torch.from_numpy(ids)

    def _fit_state_range(self) -> None:
        """Before cloning, one expert episode in every environment: the range of the
        states it visits, over every data-parallel rank, becomes the policy's state
        normalisation (``VLAPolicy.set_state_range``), so every rank reads states alike."""
        env = self.env
        observations = env.reset()
        seen, live = [observations.states], np.ones(env.num_envs, dtype=bool)
        for _ in range(env.horizon // env.chunk_size):
            observations, _, terminations, truncations, _ = env.chunk_step(env.expert_actions())
            seen.append(observations.states[live])
            live &= ~(terminations | truncations).any(axis=1)
        states = torch.from_numpy(np.concatenate(seen)).double()
        extremes = self.engine.max_over_data_parallel(
            torch.stack([states.amax(dim=0), -states.amin(dim=0)])
        )
        self.engine.vla_policy().set_state_range(-extremes[1], extremes[0])

    # ---- update ---------------------------------------------------------------------------
    def update(
        self,
        indexes: np.ndarray,
        algorithm: Algorithm,
        options: AlgorithmConfig,
        epochs: int,
        num_minibatches: int,
        micro_batch_size: int | None,
    ) -> dict[str, float]:
        """``epochs`` x ``num_minibatches`` optimizer steps on the chunk steps
        ``indexes`` the driver claimed for this rank (in index order: the same rows make
        the same mini-batches however the claim listed them); the steps' mean metrics.
        A filtered group's rows stay in the forward with no valid unit, so a rank whose
        rows are all filtered still joins every step's collectives."""
        fields = chunk_step_fields(algorithm.chunk_value_head)
        data = self.dock.fetch(np.sort(indexes), list(fields))
        spec = self.env.description.observation_spec
        steps = ChunkSteps.from_dock(data, (spec.image_height, spec.image_width, 3))
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
        units, value_units = self.engine.sum_over_data_parallel(
            [
                algorithm.valid_units(mini.valid, options, dims),
                algorithm.valid_units(mini.valid, options, dims, level=options.reward_level),
            ]
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
            if algorithm.chunk_value_head:
                value_batch = {
                    "old_values": micro.values.to(like),
                    "returns": micro.returns.to(like),
                    "valid": micro.valid.to(like.device),
                }
                value_loss, value_metrics = algorithm.chunk_value_loss(
                    scored["values"], value_batch, options, value_units
                )
                loss = loss + options.value_coef * value_loss
                metrics = {**metrics, **value_metrics, "value_loss": value_loss.detach()}
            collected.append(metrics)
            return loss

        micro_batches = [mini.rows(s) for s in _micro_slices(len(mini), micro_batch_size)]
        stats = self.engine.train_vla_step(micro_batches, loss_fn)
        dp_size = self.engine.data_parallel_size()
        return {**stats, **step_metrics(collected, algorithm.additive_metrics, dp_size)}


def cloning_record(nll: list[float]) -> dict[str, float]:
    """A cloning call's record: the NLL at its first and last step (none: no step)."""
    return {"clone_nll_first": nll[0], "clone_nll_last": nll[-1]} if nll else {}


def restarted(env: SimulatorStages, observations: Observations, ended: np.ndarray) -> Observations:
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
