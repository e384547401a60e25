"""Cross-field checks: layouts that must multiply to the world size and divide the model.

Each check returns one-line problems naming the dotted keys and the fix; the loader
prefixes the file name and reports them all together.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from mindrl.config.placement import check_placement, is_disaggregated, train_world_size
from mindrl.config.schema import (
    DataConfig,
    DockConfig,
    MindRLConfig,
    ModelConfig,
    ParallelConfig,
    RoleConfig,
)

if TYPE_CHECKING:  # mindrl.algorithm imports this package: a type-only import avoids a cycle
    from mindrl.algorithm import Algorithm


def validate_config(config: MindRLConfig, algorithm: Algorithm | None = None) -> list[str]:
    """All cross-field problems of ``config`` (empty when it is consistent).

    ``algorithm`` (the run's) decides the algorithm-dependent checks (a critic's layout,
    groups of at least two); without one, every role is checked and groups are not.
    """
    world = train_world_size(config)
    needs_critic = algorithm is None or algorithm.needs_critic
    roles = ["actor", "reference"] + (["critic"] if needs_critic else [])
    problems: list[str] = []
    for role in roles:
        parallel = getattr(config, role).parallel
        problems += check_training_layout(f"{role}.parallel", parallel, config.model, world)
    problems += check_generation_layout(config, world)
    problems += check_batch(config, algorithm)
    problems += check_lengths(config)
    problems += check_ignored_role_settings(config)
    problems += check_validation(config, algorithm)
    problems += check_placement(config, algorithm)
    problems += check_partial_rollout(config, roles, algorithm)
    if algorithm is not None:
        problems += check_algorithm_options(config, algorithm)
    if algorithm is not None and algorithm.offline:
        problems += check_offline(config, algorithm)
    return problems


def check_partial_rollout(
    config: MindRLConfig, roles: list[str], algorithm: Algorithm | None = None
) -> list[str]:
    """Partial rollout (``rollout.partial_rollout_budget``) needs an engine that continues
    a response from its prefix; what it does not support yet is one line each."""
    budget = config.rollout.partial_rollout_budget
    if algorithm is not None and algorithm.offline:
        return []  # an offline run's rollout settings are refused by check_offline
    if budget is None:
        return _check_partial_rollout_groups(config)
    key = f"rollout.partial_rollout_budget={budget}"
    problems = [
        f"{key}: generation engine '{name}' cannot continue a response from its prefix; "
        f"use rollout.engine {' or '.join(sorted(prefix_engines))}"
        for name, prefix_engines in _engines_without_prefix_continuation(config.rollout.engine)
    ]
    world, group = train_world_size(config), config.data.n_samples_per_prompt
    dp = [data_parallel_size(getattr(config, role).parallel, world) for role in roles]
    unsupported = {
        "rollout.placement: disaggregated": is_disaggregated(config),
        "dock.pipeline: stream": config.dock.pipeline == "stream",
        "dynamic sampling (DAPO)": bool(
            config.algorithm.dynamic_sampling
            or (algorithm is not None and algorithm.defaults.get("dynamic_sampling"))
        ),
        # GSPO's ratio is per sequence: a per-token behaviour weight does not apply to it.
        "--trainer gspo": algorithm is not None and algorithm.name == "gspo",
        # Every finished group must train on its own, so the update never waits on a
        # second group to fill its data-parallel split.
        f"data.n_samples_per_prompt={group} not a multiple of every data-parallel size "
        f"({', '.join(f'{r} {d}' for r, d in zip(roles, dp, strict=True))})": all(dp)
        and group % math.lcm(*dp) != 0,
    }
    problems += _check_partial_rollout_groups(config)
    return problems + [
        f"{key} with {what} is not yet supported; remove rollout.partial_rollout_budget for it"
        for what, used in unsupported.items()
        if used
    ]


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


def _engines_without_prefix_continuation(requested: str) -> list[tuple[str, frozenset[str]]]:
    """The engines ``rollout.engine`` may resolve to that cannot continue a prefix (with
    the ones that can); imported here, as the engines' registry needs transformers."""
    from backends.generation.registry import CONTINUES_PREFIX, available_engines

    candidates = available_engines() if requested == "auto" else [requested]
    return [(name, CONTINUES_PREFIX) for name in candidates if name not in CONTINUES_PREFIX]


def check_algorithm_options(config: MindRLConfig, algorithm: Algorithm) -> list[str]:
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
}


def check_offline(config: MindRLConfig, algorithm: Algorithm) -> list[str]:
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
    return problems + check_whole_pairs(config)


def check_whole_pairs(config: MindRLConfig) -> list[str]:
    """Pairs per optimizer step split evenly over the actor's DP ranks, and an even
    micro-batch: a pair never straddles two ranks or two micro-batches."""
    actor = config.actor
    problems = []
    if actor.micro_batch_size % 2:
        problems.append(
            f"actor.micro_batch_size: {actor.micro_batch_size} rows would split a pair (its "
            "chosen and rejected rows) over two micro-batches; use an even number"
        )
    dp = data_parallel_size(actor.parallel, config.world_size)
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
    },
    "critic": {"swap_optimizer": "only the actor is swapped to the host"},
}


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


def data_parallel_size(parallel: ParallelConfig, world: int) -> int:
    """DP of a training layout (0 when the layout does not divide the world)."""
    model_parallel = parallel.tp * parallel.cp * parallel.pp
    return world // model_parallel if world % model_parallel == 0 else 0


def expert_data_parallel_size(parallel: ParallelConfig, world: int) -> int:
    """Expert DP: EP * ETP * EDP * PP = world (0 when it does not divide)."""
    expert_parallel = parallel.ep * parallel.etp * parallel.pp
    return world // expert_parallel if world % expert_parallel == 0 else 0


def check_training_layout(
    key: str, parallel: ParallelConfig, model: ModelConfig, world: int
) -> list[str]:
    problems = []
    product = parallel.tp * parallel.cp * parallel.pp
    if world % product:
        problems.append(
            f"{key}: tp*cp*pp = {parallel.tp}*{parallel.cp}*{parallel.pp} = {product} does not "
            f"divide the world size {world} (resources.nodes * resources.devices_per_node)"
        )
    problems += divides(
        f"{key}.tp", parallel.tp, "model.num_attention_heads", model.num_attention_heads
    )
    if not model.uses_mla:
        problems += divides(f"{key}.tp", parallel.tp, "model.num_kv_heads", model.num_kv_heads)
    problems += divides(f"{key}.tp", parallel.tp, "model.ffn_hidden_size", model.ffn_hidden_size)
    problems += check_stage_layers(key, parallel, model)
    if model.is_moe:
        problems += divides(f"{key}.ep", parallel.ep, "model.num_experts", model.num_experts)
        expert_product = parallel.ep * parallel.etp * parallel.pp
        if world % expert_product:
            problems.append(
                f"{key}: ep*etp*pp = {expert_product} does not divide the world size {world}"
            )
    elif parallel.ep > 1 or parallel.etp > 1:
        problems.append(
            f"{key}.ep/etp: expert parallelism needs an MoE model (model.num_experts > 0)"
        )
    return problems


def stage_layer_counts(parallel: ParallelConfig, num_layers: int) -> list[int]:
    """Layers per pipeline stage: ``first_stage_layers`` first, the rest split evenly."""
    if parallel.pp == 1:
        return [num_layers]
    first = parallel.first_stage_layers
    if first is None:
        return [num_layers // parallel.pp] * parallel.pp
    return [first] + [(num_layers - first) // (parallel.pp - 1)] * (parallel.pp - 1)


def check_stage_layers(key: str, parallel: ParallelConfig, model: ModelConfig) -> list[str]:
    first = parallel.first_stage_layers
    if first is None:
        return divides(f"{key}.pp", parallel.pp, "model.num_layers", model.num_layers)
    rest = model.num_layers - first
    if parallel.pp == 1 or rest <= 0 or rest % (parallel.pp - 1):
        return [
            f"{key}.first_stage_layers: {first} leaves {rest} layers that do not split evenly over "
            f"the other {parallel.pp - 1} pipeline stages of model.num_layers {model.num_layers}"
        ]
    return []


def check_generation_layout(config: MindRLConfig, world: int) -> list[str]:
    rollout, model, train = config.rollout, config.model, config.actor.parallel
    problems = []
    if world % rollout.tp:
        problems.append(f"rollout.tp: {rollout.tp} does not divide the world size {world}")
    problems += divides(
        "rollout.tp", rollout.tp, "model.num_attention_heads", model.num_attention_heads
    )
    kv = model.num_kv_heads
    if not model.uses_mla and kv % rollout.tp:
        problems.append(
            f"rollout.tp: {rollout.tp} does not divide model.num_kv_heads {kv} (the resharder "
            "splits qkv by whole query groups; KV-head replication is not supported yet)"
        )
    if model.is_moe:
        problems += divides("rollout.ep", rollout.ep, "model.num_experts", model.num_experts)
        if world % rollout.ep:
            problems.append(f"rollout.ep: {rollout.ep} does not divide the world size {world}")
    elif rollout.ep > 1:
        problems.append("rollout.ep: expert parallelism needs an MoE model (model.num_experts > 0)")
    small, large = sorted((train.tp, rollout.tp))
    if large % small:
        problems.append(
            f"rollout.tp: generation TP {rollout.tp} and actor.parallel.tp {train.tp} must be "
            "multiples of one another so each generation shard is a run of training shards"
        )
    return problems


def check_batch(config: MindRLConfig, algorithm: Algorithm | None) -> list[str]:
    data, world = config.data, train_world_size(config)
    problems = []
    if algorithm is not None and algorithm.uses_groups and data.n_samples_per_prompt < 2:
        problems.append(
            f"data.n_samples_per_prompt: {algorithm.name} compares responses within a group and "
            f"needs at least 2, got {data.n_samples_per_prompt}"
        )
    samples = data.global_batch_size * data.n_samples_per_prompt
    dp = data_parallel_size(config.actor.parallel, world)
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


def check_validation(config: MindRLConfig, algorithm: Algorithm | None = None) -> list[str]:
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


def check_lengths(config: MindRLConfig) -> list[str]:
    rollout, model = config.rollout, config.model
    total = rollout.max_prompt_length + rollout.max_response_length
    if total > model.max_position_embeddings:
        return [
            f"rollout.max_prompt_length + rollout.max_response_length = {total} exceeds "
            f"model.max_position_embeddings {model.max_position_embeddings}"
        ]
    return []


def divides(key: str, size: int, target_key: str, target: int) -> list[str]:
    if target % size:
        return [f"{key}: {size} does not divide {target_key} {target}"]
    return []
