"""Cross-field checks: every problem of a config, one line each, all reported together.

Each check returns one-line problems naming the dotted keys and the fix; the loader
prefixes the file name and reports them all together. The layout rules are the layout
module's (mindrl/config/layout.py), what combines with what the compatibility matrix's
(mindrl/config/compat.py); this module adds the batch, length, validation, partial
rollout, generation-engine and per-algorithm checks. What an engine supports is its
class's declaration (backends/generation), imported by the checks that need it: the
engines' module imports transformers.
"""

from __future__ import annotations

import dataclasses

from mindrl.config.class_path import EnvConfigError, split_class_path
from mindrl.config.compat import AlgorithmTraits, RunFacts, model_roles, unsupported_combinations
from mindrl.config.episode_shape import episode_shape_problems
from mindrl.config.layout import (
    DISAGGREGATED,
    OFFLINE,
    RunLayout,
    layout_problems,
    placement_problems,
    resolve_layout,
)
from mindrl.config.schema import (
    EMBODIED_LEVELS,
    ENV_DEVICES,
    ENV_PLACEMENTS,
    LORA_OUTPUT_TARGET,
    LORA_TARGETS,
    AlgorithmConfig,
    DataConfig,
    DockConfig,
    MindRLConfig,
    RoleConfig,
)


def validate_config(config: MindRLConfig, algorithm: AlgorithmTraits | None = None) -> list[str]:
    """All cross-field problems of ``config`` (empty when it is consistent).

    ``algorithm`` (the run's) decides the algorithm-dependent checks (the roles it places,
    groups of at least two); without one, every role is checked and groups are not. A role
    the run does not place (a reference without a KL term, a critic outside PPO) is not
    checked: its layout never has to fit.
    """
    roles = model_roles(algorithm, _options(config, algorithm), config.actor.lora.enabled)
    offline = algorithm is not None and algorithm.offline
    layout = resolve_layout(config, roles, offline)
    facts = RunFacts(config, algorithm, layout)
    problems = layout_problems(layout, config)
    problems += check_batch(config, algorithm, layout)
    problems += check_lengths(config)
    problems += check_ignored_role_settings(config)
    problems += check_lora(config)
    problems += check_context_parallel(config)
    problems += check_vla(config, algorithm)
    problems += check_value_lr(config)
    problems += check_validation(config, algorithm)
    placement = placement_problems(config)
    problems += placement
    if not placement:  # a device count that cannot work says so alone
        problems += unsupported_combinations(DISAGGREGATED, facts)
    problems += check_partial_rollout(facts)
    problems += check_env(config) + unsupported_combinations("environment", facts)
    problems += check_embodied_trainable(config, algorithm, layout)
    if not offline:  # an offline run scores nothing (a pair's preference is its label)
        problems += check_rewards(config)
    problems += check_continuous(facts)
    if not offline:  # an offline run builds no generation engine
        problems += check_generation_engine(config)
    if algorithm is not None:
        problems += check_algorithm_options(config, algorithm)
    if offline:
        problems += check_offline(config, algorithm, layout)
    return problems


def _options(config: MindRLConfig, algorithm: AlgorithmTraits | None) -> AlgorithmConfig | None:
    """The algorithm's options; None without an algorithm or where its section does not
    resolve (check_algorithm_options says why; every role is then checked)."""
    if algorithm is None:
        return None
    try:
        return algorithm.resolve(config.algorithm)
    except ValueError:
        return None


def check_partial_rollout(facts: RunFacts) -> list[str]:
    """Partial rollout (``rollout.partial_rollout_budget``) needs an engine that continues
    a response from its prefix and an in-flight pool of at least one batch; what it does
    not support yet is the compatibility matrix's."""
    config = facts.config
    budget = config.rollout.partial_rollout_budget
    if facts.layout.mode == OFFLINE:
        return []  # an offline run's rollout settings are refused by check_offline
    if budget is None:
        return _check_partial_rollout_groups(config)
    from backends.generation.registry import available_engines, engine_class, engines_with

    requested = config.rollout.engine
    candidates = available_engines() if requested == "auto" else [requested]
    problems = [
        f"rollout.partial_rollout_budget={budget}: generation engine '{name}' cannot "
        f"continue a response from its prefix; use rollout.engine "
        f"{' or '.join(sorted(engines_with('continues_prefix')))}"
        for name in candidates
        if not engine_class(name).continues_prefix
    ]
    problems += _check_partial_rollout_groups(config)
    return problems + unsupported_combinations("partial rollout", facts)


def check_continuous(facts: RunFacts) -> list[str]:
    """Continuous generation runs on rollout workers of their own; its slot count means
    nothing without it."""
    rollout = facts.config.rollout
    problems = []
    if rollout.continuous and facts.layout.mode != DISAGGREGATED:
        problems.append(
            "rollout.continuous needs rollout.placement: disaggregated (its rollout workers "
            "decode continuously on devices of their own); set both, or remove it"
        )
    if rollout.continuous_slots is not None and not rollout.continuous:
        problems.append(
            f"rollout.continuous_slots={rollout.continuous_slots} needs rollout.continuous: "
            "true; set it or remove the slots"
        )
    return problems


def _check_partial_rollout_groups(config: MindRLConfig) -> list[str]:
    """The in-flight pool must hold a whole update's groups; it and its refill mean
    nothing without a budget (every group then trains in the iteration that drew it)."""
    rollout, batch = config.rollout, config.data.global_batch_size
    groups = rollout.partial_rollout_groups
    set_here = {
        f"rollout.partial_rollout_groups={groups}": groups is not None,
        f"rollout.partial_rollout_refill={rollout.partial_rollout_refill}": (
            rollout.partial_rollout_refill != "missing"
        ),
    }
    if rollout.partial_rollout_budget is None:
        return [
            f"{key} needs rollout.partial_rollout_budget; set a budget or remove it"
            for key, used in set_here.items()
            if used
        ]
    if groups is not None and groups < batch:
        return [
            f"rollout.partial_rollout_groups={groups}: must be >= data.global_batch_size "
            f"({batch}), the finished groups an update trains"
        ]
    return []


def check_generation_engine(config: MindRLConfig) -> list[str]:
    """The generation layout against what the engine the run builds here declares
    (``rollout.engine: auto`` resolved as the run resolves it): generation TP and EP."""
    from backends.generation.registry import (
        engine_class,
        engine_name,
        engines_with,
        is_installed,
    )

    rollout = config.rollout
    if rollout.tp == 1 and rollout.ep == 1:
        return []  # one unsharded replica: every engine serves it
    built = engine_name(rollout.engine)
    engine = engine_class(built)
    problems = []
    if rollout.tp != 1 and not engine.tensor_parallel:
        (splits, *_) = engines_with("tensor_parallel")
        installed = is_installed(splits)
        hint = "" if installed else f"; {engine_class(splits).install_hint}"
        problems.append(
            f"rollout.tp={rollout.tp} needs the {splits} engine (rollout.engine is "
            f"{rollout.engine!r}, {splits} is {'' if installed else 'not '}installed here): "
            f"set rollout.engine: {splits}, or rollout.tp: 1 for the {built} engine{hint}"
        )
    if rollout.ep != 1 and not engine.expert_parallel:
        (spreads, *_) = engines_with("expert_parallel")
        problems.append(
            f"rollout.ep={rollout.ep} needs the {spreads} engine (rollout.engine is "
            f"{rollout.engine!r}; the {built} engine keeps every expert on every rank): set "
            f"rollout.ep: 1, or rollout.engine: {spreads} on GPU / NPU"
        )
    if rollout.ep > 1 and rollout.ep % rollout.tp:
        problems.append(
            f"rollout.ep={rollout.ep}: a vLLM expert-parallel group is whole TP groups "
            f"(its data-parallel replicas), so set rollout.ep to a multiple of rollout.tp "
            f"({rollout.tp}) or to 1"
        )
    return problems


def check_algorithm_options(config: MindRLConfig, algorithm: AlgorithmTraits) -> list[str]:
    """The algorithm section as ``algorithm`` resolves it: an option it does not read, or
    one only another algorithm implements, is one problem line, not a traceback."""
    try:
        algorithm.resolve(config.algorithm)
    except ValueError as exc:
        return [str(exc)]
    return []


#: Settings an offline algorithm (stored pairs: nothing generated, scored or grouped)
#: never reads, by section: (why, the section's fields it does read). A set value would
#: silently do nothing, so it is refused like an unread algorithm option.
OFFLINE_UNREAD = {
    "rollout": ("generates nothing", ("max_prompt_length", "max_response_length")),
    "reward": ("scores nothing (a pair's preference is its label)", ()),
}
OFFLINE_UNREAD_DATA = {
    "n_samples_per_prompt": "a pair's two responses are its group",
    "prompt_key": "a pairs file's fields are prompt, chosen and rejected",
    "answer_key": "a pairs file's fields are prompt, chosen and rejected",
    "template": "a pair's prompt is used as written",
    "domain_key": "pairs have no domains (nothing routes their rewards)",
    "mixture": "pairs have no domains (nothing routes their rewards)",
}


def check_offline(config: MindRLConfig, algorithm: AlgorithmTraits, layout: RunLayout) -> list[str]:
    """Unread settings of an offline run, and batch sizes that would split a pair: the
    chosen and rejected rows of a pair must meet in one micro-batch on one rank."""
    name = algorithm.name
    problems = []
    for section, (why, read) in OFFLINE_UNREAD.items():
        given, defaults = getattr(config, section), type(getattr(config, section))()
        for field in dataclasses.fields(given):
            if field.name not in read and getattr(given, field.name) != getattr(
                defaults, field.name
            ):
                problems.append(
                    f"{section}.{field.name}: --trainer {name} trains on stored pairs and {why}, "
                    "so this setting has no effect; remove it"
                )
    for key, why in OFFLINE_UNREAD_DATA.items():
        if getattr(config.data, key) != getattr(DataConfig(), key):
            problems.append(f"data.{key}: {why} for --trainer {name}; remove it")
    if config.dock.pipeline != DockConfig().pipeline:
        problems.append(
            f"dock.pipeline: {config.dock.pipeline} overlaps scoring with generation and "
            f"--trainer {name} generates nothing; remove it"
        )
    if not isinstance(config.data.source, str):
        problems.append(f"data.source: --trainer {name} reads one source of pairs, not a list")
    return problems + check_whole_pairs(config, layout)


def check_whole_pairs(config: MindRLConfig, layout: RunLayout) -> list[str]:
    """Pairs per optimizer step split evenly over the actor's DP ranks, and an even
    micro-batch: a pair never straddles two ranks or two micro-batches."""
    actor = config.actor
    problems = []
    if actor.max_tokens_per_micro_batch is not None:
        problems.append(
            f"actor.max_tokens_per_micro_batch: {actor.max_tokens_per_micro_batch} could cut "
            "a pair's chosen and rejected rows apart; pairs train by actor.micro_batch_size, "
            "remove it"
        )
    if actor.micro_batch_size % 2:
        problems.append(
            f"actor.micro_batch_size: {actor.micro_batch_size} rows would split a pair (its "
            "chosen and rejected rows) over two micro-batches; use an even number"
        )
    dp = layout.training["actor"].dp
    pairs = actor.mini_batch_size or config.data.global_batch_size
    if dp and pairs % dp:
        key = "actor.mini_batch_size" if actor.mini_batch_size else "data.global_batch_size"
        problems.append(
            f"{key}: {pairs} pairs per optimizer step cannot be split evenly over the "
            f"actor's {dp} data-parallel ranks"
        )
    return problems


#: Settings of the shared role section that a role never reads, and why.
IGNORED_ROLE_SETTINGS = {
    "reference": {
        "optim": "the reference model does not train",
        "mini_batch_size": "the reference model does not train",
        "ppo_epochs": "the reference model does not train",
        "activation_checkpointing": "the reference model only scores, it keeps no activations",
        "swap_optimizer": "only the actor is swapped to the host",
        "lora": "only the actor trains adapters (its reference is the actor with them off)",
    },
    "critic": {
        "swap_optimizer": "only the actor is swapped to the host",
        "lora": "only the actor trains adapters",
    },
}


def check_lora(config: MindRLConfig) -> list[str]:
    """``actor.lora``: known targets, no experts, and the layouts it is tested on."""
    lora, parallel = config.actor.lora, config.actor.parallel
    if not lora.enabled:
        return []
    choices = ", ".join((*LORA_TARGETS, LORA_OUTPUT_TARGET))
    problems = []
    for target in lora.targets:
        if "expert" in target:
            problems.append(
                f"actor.lora.targets: '{target}': MoE experts take no adapters; "
                f"choose from {choices}"
            )
        elif target not in (*LORA_TARGETS, LORA_OUTPUT_TARGET):
            problems.append(f"actor.lora.targets: unknown '{target}'; choose from {choices}")
    if LORA_OUTPUT_TARGET in lora.targets and config.model.tie_word_embeddings:
        problems.append(
            "actor.lora.targets: 'output' on a model whose output layer is its input "
            "embedding (model.tie_word_embeddings) would change the embedding too; remove it"
        )
    if not lora.targets:
        problems.append("actor.lora.targets is empty: name at least one of qkv, proj, fc1, fc2")
    if parallel.cp > 1:
        problems.append(
            "actor.lora with parallel.cp > 1 is not supported yet; set actor.parallel.cp=1"
        )
    if parallel.ep > 1:
        problems.append(
            "actor.lora with parallel.ep > 1 is not supported yet (experts take no "
            "adapters); set actor.parallel.ep=1"
        )
    if is_vla(config):
        problems.append(
            f"actor.lora with model.family={config.model.family} is not supported yet (no "
            "adapters on its image, state and value heads); set actor.lora.rank=0"
        )
    return problems


def check_ignored_role_settings(config: MindRLConfig) -> list[str]:
    """A set value that would silently do nothing is refused, naming why."""
    defaults = RoleConfig()
    problems = []
    for role, settings in IGNORED_ROLE_SETTINGS.items():
        section = getattr(config, role)
        for key, why in settings.items():
            if getattr(section, key) != getattr(defaults, key):
                problems.append(f"{role}.{key}: {why}, so this setting has no effect; remove it")
    return problems


#: What context parallelism (``parallel.cp > 1``) does not run with yet: (applies to the
#: config, what to name). Multi-latent attention: its per-layer YaRN rotary and its
#: q / k wider than v are untested with the CP attention.
CONTEXT_PARALLEL_LIMITS = (
    (lambda config, role: config.model.uses_mla, "a multi-latent-attention model"),
    (
        lambda config, role: is_vla(config),
        "a vision-language-action model (image and state tokens in its rows)",
    ),
)


def is_vla(config: MindRLConfig) -> bool:
    """Whether ``model.family`` is a vision-language-action policy (the family says)."""
    from backends.megatron.families import FAMILIES

    family = FAMILIES.get(config.model.family)
    return family is not None and family.vision_language_action


def check_vla(config: MindRLConfig, algorithm: AlgorithmTraits | None = None) -> list[str]:
    """A vision-language-action policy: its image and vocabulary fit, the layouts it is
    built for (no pipeline), and no run trains it before the embodied loop exists."""
    if not is_vla(config):
        return []
    from backends.megatron.families.vla import ACTION_BINS

    model, vla = config.model, config.model.vla
    problems = []
    if vla.image_size % vla.patch_size:
        problems.append(
            f"model.vla.patch_size={vla.patch_size} does not divide model.vla.image_size="
            f"{vla.image_size}; choose a patch size that divides it"
        )
    if model.vocab_size <= ACTION_BINS:
        problems.append(
            f"model.vocab_size={model.vocab_size} leaves no ids for the instruction: the "
            f"last {ACTION_BINS} ids of a {model.family} model are action bins; set it to "
            f"the tokenizer's size + {ACTION_BINS}"
        )
    for role in ("actor", "reference", "critic"):
        pp = getattr(config, role).parallel.pp
        if pp > 1:
            problems.append(
                f"{role}.parallel.pp={pp} with model.family={model.family} is not supported "
                f"yet (its image and state tokens are built on one stage); set "
                f"{role}.parallel.pp=1"
            )
    if algorithm is not None and not config.env.embodied:
        problems.append(
            f"model.family={model.family} acts in simulators: it trains with env.kind=embodied "
            "(an env.cls VectorEnv); set them, or choose a text model family"
        )
    return problems


def check_value_lr(config: MindRLConfig) -> list[str]:
    """``optim.value_lr`` names the lr of a value head on the policy's trunk, which only
    the vla family's actor has (a critic is a value model as a whole)."""
    problems = []
    if config.actor.optim.value_lr is not None and not is_vla(config):
        problems.append(
            f"actor.optim.value_lr applies to a value head on the policy (model.family=vla); "
            f"a {config.model.family} policy has none: remove it (critic.optim.lr sets a "
            f"critic's)"
        )
    if config.critic.optim.value_lr is not None:
        problems.append(
            "critic.optim.value_lr: a critic learns values with all its weights; set "
            "critic.optim.lr instead"
        )
    return problems


def check_context_parallel(config: MindRLConfig) -> list[str]:
    """A role's ``parallel.cp > 1`` with what CP does not support yet, one line each."""
    problems = []
    for role in ("actor", "reference", "critic"):
        cp = getattr(config, role).parallel.cp
        if cp == 1:
            continue
        for applies, what in CONTEXT_PARALLEL_LIMITS:
            if applies(config, role):
                problems.append(
                    f"{role}.parallel.cp={cp} with {what} is not supported yet; "
                    f"set {role}.parallel.cp=1"
                )
    return problems


def check_batch(
    config: MindRLConfig, algorithm: AlgorithmTraits | None, layout: RunLayout
) -> list[str]:
    data = config.data
    problems = []
    if algorithm is not None and algorithm.uses_groups and data.n_samples_per_prompt < 2:
        problems.append(
            f"data.n_samples_per_prompt: {algorithm.name} compares responses within a group and "
            f"needs at least 2, got {data.n_samples_per_prompt}"
        )
    samples = data.global_batch_size * data.n_samples_per_prompt
    dp = layout.training["actor"].dp
    if dp and samples % dp:
        problems.append(
            f"data.global_batch_size * data.n_samples_per_prompt = {samples} samples cannot be "
            f"split evenly over the actor's {dp} data-parallel ranks"
        )
    for role in ("actor", "critic"):
        mini = getattr(config, role).mini_batch_size
        if mini is not None and data.global_batch_size % mini:
            problems.append(
                f"{role}.mini_batch_size: {mini} does not divide data.global_batch_size "
                f"{data.global_batch_size}"
            )
    return problems


def check_validation(config: MindRLConfig, algorithm: AlgorithmTraits | None = None) -> list[str]:
    """Validation needs held-out prompts, and held-out prompts need validation to run.

    No default source: only a synthetic task could make a held-out split, and evaluating
    a file source on its own training prompts would report training reward as validation.
    """
    data = config.data
    if data.val_every and algorithm is not None and algorithm.offline:
        return [
            f"data.val_every: --trainer {algorithm.name} trains on stored pairs and builds no "
            "generation engine, which validation generates with; set data.val_every: 0"
        ]
    if data.val_every and data.val_source is None:
        return [
            f"data.val_every: {data.val_every} needs data.val_source (held-out prompts: "
            "'synthetic:<task>' or a .jsonl / .parquet file); set it, or data.val_every: 0"
        ]
    if not data.val_every and data.val_source is not None:
        return [
            f"data.val_source: {data.val_source!r} is set but data.val_every is 0, so no "
            "validation runs; set data.val_every (iterations between validations) or remove it"
        ]
    return []


def check_rewards(config: MindRLConfig) -> list[str]:
    """What the config alone says of its rewards and data mixture. The functions, routes
    and what the built-ins need are checked where they are imported, at start-up and in
    ``--dry-run`` (mindrl/rewards/routing.py, ``reward_problems``), and the data's domains
    where the data is read (trainers/driver/setup.py)."""
    reward, data = config.reward, config.data
    if config.env.enabled or config.env.embodied:
        given = [key for key in ("functions", "routes") if getattr(reward, key)]
        return [
            f"reward.{key}: a run with env is rewarded by its environment's steps; remove it"
            for key in given
        ]
    problems = [] if data.source else ["data.source: an empty list; name at least one source"]
    problems += [
        f"data.mixture.{domain}: a ratio is a number > 0, got {ratio!r}"
        for domain, ratio in data.mixture.items()
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not ratio > 0
    ]
    if not data.domain_key:
        problems.append("data.domain_key: name the field of a row's domain (default 'domain')")
    return problems


def check_env(config: MindRLConfig) -> list[str]:
    """The environment's name has the loader's form (mindrl/config/class_path.py) and a
    turn fits the trajectory (the class itself is imported at start-up,
    mindrl/envs/base.py)."""
    env = config.env
    if env.embodied:
        return check_embodied_env(config)
    problems = []
    if env.clone_steps:
        problems.append(
            f"env.clone_steps={env.clone_steps} clones a simulator's scripted expert: it "
            "needs env.kind=embodied; set env.clone_steps=0"
        )
    if (
        env.placement != ENV_PLACEMENTS[0]
        or env.pipeline_stages != 1
        or env.device != ENV_DEVICES[0]
    ):
        problems.append(
            f"env.placement={env.placement} / env.pipeline_stages={env.pipeline_stages} / "
            f"env.device={env.device} place a simulator's steps: they need env.kind=embodied "
            "(text environments have env.workers); remove them"
        )
    if not env.enabled:
        return problems
    try:
        split_class_path(env.cls)
    except EnvConfigError as exc:
        problems.append(str(exc))
    response = config.rollout.max_response_length
    if env.max_turn_tokens is not None and env.max_turn_tokens > response:
        problems.append(
            f"env.max_turn_tokens={env.max_turn_tokens} exceeds rollout.max_response_length="
            f"{response}, the whole trajectory's room after the prompt; lower it or raise "
            "rollout.max_response_length"
        )
    return problems


def check_embodied_env(config: MindRLConfig) -> list[str]:
    """An embodied environment is named in the loader's form and its chunks tile an
    episode (the class itself is imported at start-up, mindrl/envs/embodied.py)."""
    env = config.env
    if env.cls is None:
        return [
            "env.kind=embodied needs env.cls, a VectorEnv subclass (e.g. "
            "'mindrl.envs.batched_reach:BatchedReach')"
        ]
    problems = []
    if env.clone_state_range and not env.clone_steps:
        problems.append(
            "env.clone_state_range fits the state normalisation to the scripted expert "
            "before cloning: it needs env.clone_steps > 0 (or set it false)"
        )
    if env.clone_data and not env.clone_steps:
        problems.append(
            f"env.clone_data={env.clone_data!r} is cloned in env.clone_steps steps: set "
            "env.clone_steps > 0 (or unset env.clone_data)"
        )
    try:
        split_class_path(env.cls)
    except EnvConfigError as exc:
        problems.append(str(exc))
    problems += episode_shape_problems(env.num_envs, env.chunk_size, env.horizon)
    return problems + embodied_level_problems(config.algorithm)


def embodied_level_problems(options: AlgorithmConfig) -> list[str]:
    """An advantage finer than the log-prob it weighs cannot train: one ratio per chunk
    cannot carry one advantage per action (trainers/granularity.py)."""
    reward, logprob = options.reward_level, options.logprob_level
    if EMBODIED_LEVELS.index(logprob) >= EMBODIED_LEVELS.index(reward):
        return []
    return [
        f"algorithm.reward_level={reward} with algorithm.logprob_level={logprob}: one "
        f"{logprob} log-prob cannot carry an advantage per {reward}; set "
        f"algorithm.logprob_level to {reward} or token"
    ]


def check_embodied_trainable(
    config: MindRLConfig, algorithm: AlgorithmTraits | None, layout: RunLayout
) -> list[str]:
    """What an embodied run's loop is built for (trainers/driver/embodied.py): a
    vision-language-action policy, a group algorithm at the chunk reward level or PPO at
    either, collocated, fixed-length episodes, groups within one rank's environments.
    Everything else is refused, one line each."""
    if algorithm is None or not config.env.embodied:
        return []
    return [line for applies, line in _embodied_limits(config, algorithm, layout) if applies]


def embodied_credit(algorithm: AlgorithmTraits) -> str | None:
    """How an embodied run of ``algorithm`` credits its chunk steps: ``group`` (a group
    algorithm's statistics over whole episodes), ``value`` (GAE from a value head shared
    with the policy), or None: not built."""
    if algorithm.offline:
        return None
    if algorithm.chunk_value_head:
        return "value"
    return "group" if algorithm.uses_groups and not algorithm.needs_critic else None


def _embodied_limits(
    config: MindRLConfig, algorithm: AlgorithmTraits, layout: RunLayout
) -> list[tuple[bool, str]]:
    """(whether the config hits it, the line) for every limit of the embodied loop."""
    env, data, options = config.env, config.data, _options(config, algorithm)
    trainer = f"env.kind=embodied with --trainer {algorithm.name}"
    groups, dp = env.num_envs // data.n_samples_per_prompt, layout.training["actor"].dp or 1
    lines = [
        (
            not is_vla(config),
            f"env.kind=embodied trains a vision-language-action policy; set model.family=vla "
            f"(got {config.model.family})",
        ),
        (
            not embodied_credit(algorithm),
            f"{trainer}: embodied runs train group algorithms without a critic (grpo, rloo) "
            "and ppo (a value head shared with the policy); this one is not built for them",
        ),
        (
            layout.mode == DISAGGREGATED,
            "env.kind=embodied runs collocated only (the actor's ranks step the environments); "
            "set rollout.placement=collocated",
        ),
        (
            env.auto_reset,
            "env.kind=embodied trains on fixed-length episodes (one per environment and "
            "iteration); set env.auto_reset=false",
        ),
        (
            env.num_envs % data.n_samples_per_prompt != 0,
            f"env.num_envs={env.num_envs} is not a whole number of groups of "
            f"data.n_samples_per_prompt={data.n_samples_per_prompt} environments",
        ),
        (
            data.global_batch_size != groups,
            f"data.global_batch_size={data.global_batch_size}: an embodied iteration trains "
            f"env.num_envs / data.n_samples_per_prompt = {groups} groups; set it to {groups}",
        ),
        (
            (env.num_envs // dp) % env.pipeline_stages != 0,
            f"env.pipeline_stages={env.pipeline_stages} does not divide a rank's "
            f"{env.num_envs // dp} environments (env.num_envs={env.num_envs} over {dp} actor "
            "data-parallel ranks); pick a divisor",
        ),
        (
            (env.num_envs // dp) % data.n_samples_per_prompt != 0,
            f"env.num_envs={env.num_envs} over {dp} actor data-parallel ranks splits a group of "
            f"{data.n_samples_per_prompt} environments; make num_envs / dp a multiple of it",
        ),
        (
            config.model.vla.chunk_size != env.chunk_size,
            f"model.vla.chunk_size={config.model.vla.chunk_size} differs from env.chunk_size="
            f"{env.chunk_size}; the policy emits one chunk per chunk step: set them equal",
        ),
        (
            config.rollout.temperature <= 0,
            "env.kind=embodied samples actions at rollout.temperature > 0 (the update "
            "scores them under the same distribution); set it above 0",
        ),
        (
            data.val_every > 0,
            "data.val_every: an embodied run has no validation yet; set data.val_every: 0",
        ),
    ]
    if options is not None:
        lines += [
            (
                options.reward_level != "chunk" and embodied_credit(algorithm) == "group",
                f"{trainer}: algorithm.reward_level={options.reward_level} is not built (a "
                "group algorithm's advantage is the episode's); set algorithm.reward_level=chunk",
            ),
            (
                options.kl_coef > 0 or options.adaptive_kl,
                f"{trainer}: no reference policy is built for the vla family; set "
                "algorithm.kl_coef=0 (and adaptive_kl false)",
            ),
            (
                options.loss_agg_mode != "token-mean",
                f"{trainer}: algorithm.loss_agg_mode={options.loss_agg_mode} is not built; "
                "embodied losses average the valid units (token-mean)",
            ),
        ]
    return lines


def check_lengths(config: MindRLConfig) -> list[str]:
    rollout, model = config.rollout, config.model
    total = rollout.max_prompt_length + rollout.max_response_length
    if total > model.max_position_embeddings:
        return [
            f"rollout.max_prompt_length + rollout.max_response_length = {total} exceeds "
            f"model.max_position_embeddings {model.max_position_embeddings}"
        ]
    return []
