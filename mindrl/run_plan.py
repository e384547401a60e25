"""The run plan: one description of a run, built from the algorithm and the config.

Everything that needs to know the stages or the devices reads it: the dock (one TD
controller per stage, the fields each stage claims), the iteration loop (which runner,
which stages run, in what order, what they claim and with which deadline), the planner
(``--dry-run``: stages, roles, layouts, dock fields), start-up (which model roles to
place, where, with which engine layout) and the CLI. Its mode and layouts are decided
here once (mindrl/config/layout.py) and never asked of the config again
(docs/architecture.md §3 draws one iteration's data flow).
"""

from __future__ import annotations

from dataclasses import dataclass

from mindrl.algorithm import Algorithm, run_options
from mindrl.config.compat import model_roles, uses_reference
from mindrl.config.layout import DISAGGREGATED, OFFLINE, RunLayout, resolve_layout
from mindrl.config.schema import ENV_WORKER_PLACEMENTS, AlgorithmConfig, MindRLConfig
from mindrl.data.records import RECORD_FIELDS
from mindrl.dock.schema import chunk_step_fields
from mindrl.rewards.routing import reward_spec_of

#: Fields every model stage reads: the packed sequence is prompt + response.
SEQUENCE = ("prompt_ids", "response_ids")
#: A multi-turn run's trajectories also carry which tokens the model wrote (1) and which
#: the environment did (0): every stage that scores or trains on them reads it.
LOSS_MASK = "loss_mask"
#: The stage that scores the reference log-probs (reference_role says who serves it).
REFERENCE_STAGE = "ref_logp"
#: The sum of an episode's step rewards, which the rollout puts and the reward stage reads.
ENV_REWARD = "env_reward"
#: A prompt's group, which the driver puts beside the prompt with its record
#: (mindrl/data/records.py): group-relative estimators and filters read it.
GROUP_ID = "group_id"
#: What the driver puts per sample: the prompt, its record and its group.
PROMPT_FIELDS = ("prompt_ids", *RECORD_FIELDS, GROUP_ID)

#: What the group filter (DAPO's dynamic sampling) reads of a scored batch.
FILTER_READS = ("reward", GROUP_ID)
#: A stage's deadline is this many dock timeouts: a stage waits for the dock several
#: times (claims, fetches) and a slow worker must not be declared dead too early.
STAGE_DEADLINE_DOCK_TIMEOUTS = 5


#: Roles whose workers never run on the generating devices, so their stages can run while
#: the actor generates: reward workers are CPU processes of their own. The model roles
#: share the actor's devices (all-colocated placement, trainers/driver/setup.py) and take
#: turns with generation; a role placed on devices of its own belongs here.
ROLES_OFF_GENERATION_DEVICES = frozenset({"reward"})

#: The iteration runners (trainers/driver/runners.py), one per way an iteration runs.
#: ``online``: generate, score, update in turn on the same devices (optionally streaming);
#: ``continuous``: rollout workers decoding continuously (trainers/driver/continuous.py).
ONLINE, PARTIAL_ROLLOUT, CONTINUOUS = "online", "partial_rollout", "continuous"
#: ``embodied``: the actor's ranks step their vector environments and train on the
#: episodes they keep (mindrl/workers/embodied.py, trainers/driver/embodied.py).
EMBODIED = "embodied"
#: Partial rollout's default in-flight pool, in batches of data.global_batch_size groups:
#: room for one batch to finish while up to one more batch of long responses is paused.
PARTIAL_ROLLOUT_BATCHES = 2


@dataclass(frozen=True)
class StagePlan:
    """One stage: the worker group that serves it, the dock fields it reads and writes,
    and whether each of its workers must get whole groups (a reward function that scores
    a prompt's responses together)."""

    name: str
    role: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    whole_groups: bool = False


@dataclass(frozen=True)
class RunPlan:
    """An iteration's stages in order and the facts derived from the algorithm + config.

    Attributes:
        trainer: the algorithm's name.
        mode: how generation shares the devices (``collocated``, ``disaggregated``) or
            ``offline`` (stored samples, nothing generates); mindrl/config/layout.py.
        runner: the iteration runner that runs it (``online``, ``partial_rollout``,
            ``disaggregated``, ``continuous`` or ``offline``; trainers/driver/runners.py).
        layout: the devices that train and generate and every model role's layout.
        stages: in the order an iteration runs them.
        needs_reference / needs_critic / needs_old_logprob: which optional stages run.
        model_roles: the model worker groups to place (``actor`` first).
        group_size: responses per prompt (the dock hands out whole groups).
        uses_groups: advantages compare the responses of one prompt.
        group_local_advantages: a group's advantages read that group alone, so the
            advantage stage may run on each node (:attr:`Algorithm.group_local_advantages`).
        sample_batches: prompt batches an iteration may draw (DAPO refills dropped groups).
        dock_groups: groups the dock holds: ``sample_batches`` batches, or partial
            rollout's in-flight pool (``rollout.partial_rollout_groups``).
        stage_deadline_s: how long a stage's workers may take before the run ends.
        offline: trains on stored samples (DPO's pairs): no rollout, reward or advantage.
        options: the algorithm's options as the run trains with them (resolved once, here).
        tokens_may_lag: a trained token may come from older weights than the trained ones
            (``rollout.max_staleness > 0`` or partial rollout): the loss then weights each
            token by its behaviour ratio (``algorithm.behaviour_is_cap``).
        offloaded_roles: collocated roles whose state waits on the host between their
            stages, brought back to the device before each (the planner's fit check
            decides, mindrl/planner/offload.py); none until it has.
        sequence: the fields a model stage reads to pack its rows (``SEQUENCE``, plus the
            loss mask of a multi-turn run's trajectories).
    """

    trainer: str
    mode: str
    runner: str
    layout: RunLayout
    stages: tuple[StagePlan, ...]
    needs_reference: bool
    needs_critic: bool
    needs_old_logprob: bool
    model_roles: tuple[str, ...]
    group_size: int
    uses_groups: bool
    sample_batches: int
    dock_groups: int
    stage_deadline_s: float
    options: AlgorithmConfig
    tokens_may_lag: bool = False
    group_local_advantages: bool = False
    offloaded_roles: tuple[str, ...] = ()
    sequence: tuple[str, ...] = SEQUENCE

    @property
    def offline(self) -> bool:
        """Trains on stored samples (DPO's pairs): no rollout, reward or advantage."""
        return self.mode == OFFLINE

    def stage(self, name: str) -> StagePlan:
        """The stage called ``name``.

        Raises:
            KeyError: the plan has no such stage (it is switched off for this run).
        """
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(f"stage '{name}' is not part of this {self.trainer} run")

    @property
    def stage_names(self) -> tuple[str, ...]:
        return tuple(stage.name for stage in self.stages)

    @property
    def generates(self) -> bool:
        """Whether an iteration samples responses (it has a ``rollout`` stage). Offline
        runs train on stored samples: the planner then places no generation engine and
        sizes no generation layout, KV cache or allgather-swap (mindrl/planner)."""
        return "rollout" in self.stage_names

    @property
    def has_generation_engine(self) -> bool:
        """Whether the run holds a generation engine (weights resharded into it, a KV
        cache, allgather-swap): a run that generates, unless it is embodied, whose policy
        generates with the training model's own forward."""
        return self.generates and self.runner != EMBODIED

    def dock_stages(self) -> dict[str, list[str]]:
        """Stage -> the fields its claims read, as the dock's controllers are built."""
        return {stage.name: list(stage.reads) for stage in self.stages}

    def stage_roles(self) -> dict[str, str]:
        """Stage -> the worker group serving it (its TD controller sits on that node)."""
        return {stage.name: stage.role for stage in self.stages}

    def scoring_stages(self) -> tuple[str, ...]:
        """Stages that score the generated sequences with a model (reference, old-policy
        and value log-probs), in plan order: those between ``reward`` and ``advantage``."""
        names = self.stage_names
        if self.offline:  # stored sequences: every stage before the update scores them
            return names[: names.index("update")]
        return names[names.index("reward") + 1 : names.index("advantage")]

    def streaming_stages(self, until_filter: bool = False) -> tuple[str, ...]:
        """Stages that take samples in chunks while the rollout generates (``dock.pipeline:
        stream``), in plan order.

        Those between ``rollout`` and ``advantage`` read only the prompt and the rollout's
        writes, so each sample can go on as soon as it is generated; of them, the ones
        whose role is off the generating devices overlap generation. ``advantage`` waits
        for the whole batch (estimators may normalise over it), and with a group filter
        (``until_filter``: DAPO) only ``reward`` streams: the filter needs every reward
        before the model stages score the groups it keeps.
        """
        if self.offline:  # nothing is generated, so nothing can overlap generation
            return ()
        names = self.stage_names
        between = self.stages[names.index("rollout") + 1 : names.index("advantage")]
        if until_filter:
            between = tuple(s for s in between if s.name == "reward")
        return tuple(s.name for s in between if s.role in ROLES_OFF_GENERATION_DEVICES)

    def written_fields(self) -> tuple[str, ...]:
        """Every field a stage of this run writes, in stage order."""
        return tuple(field for stage in self.stages for field in stage.writes)


def build_run_plan(algorithm: Algorithm, config: MindRLConfig) -> RunPlan:
    """The plan of ``algorithm`` (its options resolved from ``config``) on ``config``."""
    if algorithm.offline:
        return _offline_plan(algorithm, config)
    if config.env.embodied:
        return _embodied_plan(algorithm, config)
    options = run_options(algorithm, config)
    roles = model_roles(algorithm, options, config.actor.lora.enabled)
    needs_reference, needs_critic = uses_reference(algorithm, options), "critic" in roles
    needs_old = needs_old_logprob(config)
    layout = resolve_layout(config, roles)
    return RunPlan(
        trainer=algorithm.name,
        mode=layout.mode,
        runner=runner_for(layout.mode, config),
        layout=layout,
        stages=_stages(
            needs_reference,
            needs_critic,
            needs_old,
            algorithm.advantage_inputs(options),
            tokens_may_lag(config),
            config.env.enabled,
            config.reward.reward_model is not None,
            not config.env.enabled and reward_spec_of(config.reward).uses_groups,
            reference_role(config),
        ),
        needs_reference=needs_reference,
        needs_critic=needs_critic,
        needs_old_logprob=needs_old,
        model_roles=roles,
        group_size=config.data.n_samples_per_prompt,
        uses_groups=algorithm.uses_groups,
        sample_batches=sample_batches(options, config),
        dock_groups=dock_groups(options, config),
        stage_deadline_s=stage_deadline_s(config),
        options=options,
        tokens_may_lag=tokens_may_lag(config),
        group_local_advantages=algorithm.group_local_advantages,
        sequence=sequence_fields(config),
    )


def sequence_fields(config: MindRLConfig) -> tuple[str, ...]:
    """What a model stage reads to pack its rows: prompt and response, and with an
    environment the trajectory's loss mask (docs/architecture.md §12)."""
    return (*SEQUENCE, LOSS_MASK) if config.env.enabled else SEQUENCE


def runner_for(mode: str, config: MindRLConfig) -> str:
    """The runner of a run in ``mode``: its own for offline and disaggregated runs (the
    continuous one where rollout workers decode continuously, sampling ahead of the
    trained weights), partial rollout's with a generation budget, else the online loop."""
    if mode == DISAGGREGATED and continuous_generation(config):
        return CONTINUOUS
    if mode in (OFFLINE, DISAGGREGATED):
        return mode
    return PARTIAL_ROLLOUT if config.rollout.partial_rollout_budget is not None else ONLINE


def continuous_generation(config: MindRLConfig) -> bool:
    """Rollout workers decode continuously: ``rollout.continuous`` with a staleness bound
    that lets them sample ahead (with ``max_staleness: 0`` the run is on-policy)."""
    return config.rollout.continuous and config.rollout.max_staleness > 0


def continuous_groups(config: MindRLConfig) -> int:
    """Groups continuous generation keeps in flight: ``max_staleness + 1`` batches. The
    driver draws prompts into every free slot only once the rollout workers hold the
    trained weights, so a group starts at most ``max_staleness`` updates before the one
    that trains it, were it trained in draw order (AReaL's admission bound)."""
    return (config.rollout.max_staleness + 1) * config.data.global_batch_size


def tokens_may_lag(config: MindRLConfig) -> bool:
    """Whether a trained token may come from older weights than the trained ones: a sample
    generated before the last update (``rollout.max_staleness``) or a response continued
    across updates (``rollout.partial_rollout_budget``)."""
    return config.rollout.max_staleness > 0 or config.rollout.partial_rollout_budget is not None


def partial_rollout_groups(config: MindRLConfig) -> int:
    """Groups partial rollout keeps in flight (``rollout.partial_rollout_groups``, by
    default 2 x data.global_batch_size); the dock holds that many."""
    groups = config.rollout.partial_rollout_groups
    return PARTIAL_ROLLOUT_BATCHES * config.data.global_batch_size if groups is None else groups


#: Samples per stored pair: the chosen and the rejected response, adjacent in the dock.
PAIR_SIZE = 2


def reference_role(config: MindRLConfig) -> str:
    """The role that scores the reference log-probs: the reference model, or a LoRA actor
    with its adapters off (the frozen base is the reference)."""
    return "actor" if config.actor.lora.enabled else "reference"


def _offline_plan(algorithm: Algorithm, config: MindRLConfig) -> RunPlan:
    """An offline algorithm's plan: the driver puts each pair as two samples (one dock
    group: chosen at the even index, rejected after it), the reference scores them and
    the actor trains. Its loss compares the policy with the reference only, so there is
    no old_logp stage whatever the epochs and mini-batches."""
    stages = (
        StagePlan(REFERENCE_STAGE, reference_role(config), SEQUENCE, ("ref_logprob",)),
        StagePlan("update", "actor", (*SEQUENCE, "ref_logprob"), ()),
    )
    roles = model_roles(algorithm, run_options(algorithm, config), config.actor.lora.enabled)
    return RunPlan(
        trainer=algorithm.name,
        mode=OFFLINE,
        runner=OFFLINE,
        layout=resolve_layout(config, roles, offline=True),
        stages=stages,
        needs_reference=True,
        needs_critic=False,
        needs_old_logprob=False,
        model_roles=roles,
        group_size=PAIR_SIZE,
        uses_groups=True,
        sample_batches=1,
        dock_groups=config.data.global_batch_size,
        stage_deadline_s=stage_deadline_s(config),
        options=run_options(algorithm, config),
    )


def _embodied_plan(algorithm: Algorithm, config: MindRLConfig) -> RunPlan:
    """An embodied run's plan: the actor's ranks run the episodes (``rollout``) and put
    each chunk step into the dock as a sample, with its advantages (a group's episodes
    are stepped on one rank); the ``update`` claims them for the actor's data-parallel
    ranks. A group is ``data.n_samples_per_prompt`` environments sharing an initial
    state; ``env.num_envs`` of them run per iteration, so the dock holds ``num_envs``
    samples per chunk of the horizon. The actor is the only model role: PPO's values
    come from a head on the policy."""
    options = run_options(algorithm, config)
    roles = ("actor",)
    layout = resolve_layout(config, roles)
    fields = chunk_step_fields(algorithm.chunk_value_head)
    return RunPlan(
        trainer=algorithm.name,
        mode=layout.mode,
        runner=EMBODIED,
        layout=layout,
        stages=(
            StagePlan("rollout", "actor", (), fields),
            StagePlan("update", "actor", fields, ()),
        ),
        needs_reference=False,
        needs_critic=False,
        needs_old_logprob=False,
        model_roles=roles,
        group_size=config.data.n_samples_per_prompt,
        uses_groups=algorithm.uses_groups,
        sample_batches=1,
        dock_groups=embodied_chunk_steps(config) // config.data.n_samples_per_prompt,
        stage_deadline_s=stage_deadline_s(config),
        options=options,
    )


def embodied_chunk_steps(config: MindRLConfig) -> int:
    """The chunk steps of an embodied iteration, each a dock sample: one per chunk of
    the horizon in every environment."""
    env = config.env
    return env.horizon // env.chunk_size * env.num_envs


def embodied_env_workers(config: MindRLConfig, plan: RunPlan) -> int:
    """Environment workers an embodied run places: under ``env.placement: hybrid`` or
    ``disaggregated`` one for each actor rank (one CPU slot each), else none."""
    if config.env.embodied and config.env.placement in ENV_WORKER_PLACEMENTS:
        return plan.layout.training["actor"].world
    return 0


def stage_deadline_s(config: MindRLConfig) -> float:
    """Seconds a stage (or a start-up phase) may take; see STAGE_DEADLINE_DOCK_TIMEOUTS."""
    return config.dock.timeout_s * STAGE_DEADLINE_DOCK_TIMEOUTS


def sample_batches(options: AlgorithmConfig, config: MindRLConfig) -> int:
    """Prompt batches the dock holds per iteration (dynamic sampling refills dropped groups;
    with rollout.max_staleness > 0 the next batch generates beside the one training)."""
    return 2 if options.dynamic_sampling or config.rollout.max_staleness > 0 else 1


def dock_groups(options: AlgorithmConfig, config: MindRLConfig) -> int:
    """Groups the dock holds: the batches an iteration draws, or under partial rollout the
    groups it keeps in flight across iterations (trainers/driver/partial_rollout.py)."""
    if config.rollout.partial_rollout_budget is not None:
        return partial_rollout_groups(config)
    if continuous_generation(config):
        return continuous_groups(config)
    return config.data.global_batch_size * sample_batches(options, config)


def needs_old_logprob(config: MindRLConfig) -> bool:
    """Whether old log-probs must be computed: more than one optimizer step per iteration.

    With exactly one step, the policy that generated the samples is the policy being
    trained, so ``old_logprob`` equals the (detached) training forward's log-probs.
    """
    actor = config.actor
    prompts = config.data.global_batch_size
    one_minibatch = (actor.mini_batch_size or prompts) >= prompts
    return actor.ppo_epochs > 1 or not one_minibatch


def _stages(
    needs_reference: bool,
    needs_critic: bool,
    needs_old: bool,
    advantage_inputs: tuple[str, ...],
    token_versions: bool = False,
    multi_turn: bool = False,
    reward_model: bool = False,
    reward_groups: bool = False,
    reference: str = "reference",
) -> tuple[StagePlan, ...]:
    """The stages in order. ``multi_turn``: the rollout runs episodes, so it also writes
    each trajectory's loss mask and environment reward; the reward stage reads that reward
    (no verifier), and every stage that packs rows or computes advantages reads the mask.
    ``reward_model``: the reward stage also scores the decoded prompt + response.
    ``reward_groups``: a reward function scores a prompt's responses together, so the
    reward stage reads the group and takes whole groups. ``reference``: the role that
    scores ``ref_logp``."""
    sequence = (*SEQUENCE, LOSS_MASK) if multi_turn else SEQUENCE
    update_reads = (*sequence, "advantages", "rollout_logprob")
    update_reads += ("old_logprob",) if needs_old else ()
    update_reads += ("ref_logprob",) if needs_reference else ()
    advantage_reads = ("reward", "response_ids", GROUP_ID) + (("values",) if needs_critic else ())
    advantage_reads += advantage_inputs + ((LOSS_MASK,) if multi_turn else ())
    advantage_writes = ("advantages",) + (("returns",) if needs_critic else ())
    # Where tokens may lag, each records the weights version that sampled it.
    rollout_writes = ("response_ids", "rollout_logprob")
    rollout_writes += ("rollout_version",) if token_versions else ()
    reward_reads = ("response_ids", *RECORD_FIELDS)
    reward_reads += ("prompt_ids",) if reward_model else ()
    reward_reads += (GROUP_ID,) if reward_groups else ()
    rollout_reads: tuple[str, ...] = ("prompt_ids",)
    if multi_turn:  # an environment's reset gets the prompt's record
        rollout_reads += RECORD_FIELDS
        rollout_writes += (LOSS_MASK, ENV_REWARD)
        reward_reads = ("response_ids", ENV_REWARD)
    stages = [
        StagePlan("rollout", "actor", rollout_reads, rollout_writes),
        StagePlan("reward", "reward", reward_reads, ("reward",), whole_groups=reward_groups),
    ]
    if needs_reference:
        stages.append(StagePlan(REFERENCE_STAGE, reference, sequence, ("ref_logprob",)))
    if needs_old:
        stages.append(StagePlan("old_logp", "actor", sequence, ("old_logprob",)))
    if needs_critic:
        stages.append(StagePlan("values", "critic", sequence, ("values",)))
    stages.append(StagePlan("advantage", "reward", advantage_reads, advantage_writes))
    stages.append(StagePlan("update", "actor", update_reads, ()))
    if needs_critic:
        stages.append(StagePlan("critic_update", "critic", (*sequence, "values", "returns"), ()))
    return tuple(stages)
