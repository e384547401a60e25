"""Where a run's roles sit and how each is laid out, decided once.

:func:`resolve_layout` turns the config into a :class:`RunLayout`: the run's mode (how
generation shares the devices), the devices that train and those that generate, every
model role's training layout (TP, PP, CP, EP, ETP, the layers of each pipeline stage and
the data-parallel sizes the world leaves) and the generation layout. The run plan holds
it (``RunPlan.layout``) and everything reads it from there: start-up places the workers
by it, each engine is built from it (mindrl/config/specs.py), the planner sizes memory
with it, the iteration runners follow its mode.

:func:`layout_problems` is the one validator of the layout rules (sizes that divide the
world and the model, layers per pipeline stage, the generation layout against the
training one, the rollout devices' count). It checks the resolved layout, so what it
accepts is exactly what runs; the training engine does not repeat these rules
(backends/megatron/spec.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from mindrl.config.schema import MindRLConfig, ModelConfig, ParallelConfig, RoleConfig

#: The actor's ranks generate between updates on every device (the paper's all-colocated
#: placement, allgather-swap).
COLLOCATED = "collocated"
#: ``rollout.devices`` devices run rollout workers of their own; the model roles train on
#: the others and send the new weights after every update (docs/architecture.md §8).
DISAGGREGATED = "disaggregated"
#: Stored samples (DPO's pairs): the model roles train on every device, nothing generates.
OFFLINE = "offline"
#: The process of a disaggregated rollout device (mindrl/workers/rollout_worker.py).
ROLLOUT_WORKER = "rollout"
#: An embodied run's environment worker, where it shares its actor rank's device.
ENV_WORKER = "env"


@dataclass(frozen=True)
class TrainingLayout:
    """One model role's training layout over ``world`` devices.

    ``dp`` and ``edp`` are what the world leaves once TP x CP x PP (experts: EP x ETP x
    PP) are taken, 0 when that does not divide it (:func:`layout_problems` refuses it).
    """

    world: int
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    first_stage_layers: int | None
    stage_layers: tuple[int, ...]
    activation_checkpointing: bool

    @property
    def dp(self) -> int:
        model_parallel = self.tp * self.cp * self.pp
        return self.world // model_parallel if self.world % model_parallel == 0 else 0

    @property
    def edp(self) -> int:
        expert_parallel = self.ep * self.etp * self.pp
        return self.world // expert_parallel if self.world % expert_parallel == 0 else 0


@dataclass(frozen=True)
class GenerationLayout:
    """The generation engine's layout over the ``world`` devices that generate (PP = 1)."""

    world: int
    tp: int
    ep: int

    @property
    def dp(self) -> int:
        return self.world // self.tp


@dataclass(frozen=True)
class DeviceBundle:
    """One bundle of the run's placement group: the worker processes in it, by role, and
    the devices they share."""

    processes: tuple[str, ...]
    devices: int = 1


@dataclass(frozen=True)
class RunLayout:
    """The run's devices, as the plan holds them.

    Attributes:
        mode: :data:`COLLOCATED`, :data:`DISAGGREGATED` or :data:`OFFLINE`.
        train_devices: devices the model roles train on (all of them but the rollout's).
        rollout_devices: devices of their own that generate (disaggregated), else 0.
        training: each model role's training layout, in plan order (``actor`` first).
        generation: the generation layout; ``None`` when nothing generates (offline).
        beside: worker processes that share every training device with the model roles
            (an embodied run's environment workers under ``env.device: accelerator``,
            ``env.placement: hybrid``).
        env_devices: devices of their own that environment workers step simulators on
            (``env.device: accelerator``, ``env.placement: disaggregated``), placed apart
            from the run's placement group.
    """

    mode: str
    train_devices: int
    rollout_devices: int
    training: dict[str, TrainingLayout]
    generation: GenerationLayout | None
    beside: tuple[str, ...] = ()
    env_devices: int = 0

    @property
    def devices(self) -> int:
        """Every device the run uses: the training ones, the rollout workers' own and
        the environment workers' own."""
        return self.train_devices + self.rollout_devices + self.env_devices

    @property
    def training_processes(self) -> tuple[str, ...]:
        """The worker processes on each training device: the model roles, then those
        beside them."""
        return (*self.training, *self.beside)

    def device_processes(self) -> list[tuple[str, ...]]:
        """The placement: the worker processes on each device, by role, in device order.

        Every training device holds one process of each model role (rank ``r`` of every
        role on device ``r``; the actor's process also generates when collocated), which
        take turns on it stage by stage; each rollout device serves a rollout worker (one
        worker per ``rollout.tp`` devices, :meth:`bundles`). One process per role, not one
        per device: Megatron-core's parallel state is one per process, and the roles'
        layouts may differ (docs/architecture.md, Placement).
        """
        return [self.training_processes] * self.train_devices + [
            (ROLLOUT_WORKER,)
        ] * self.rollout_devices

    def bundles(self) -> list[DeviceBundle]:
        """The placement group's bundles in device order: each training device with its
        model roles' processes, then each rollout worker with the devices of its
        generation TP group. A rollout worker at ``rollout.tp > 1`` owns its group whole:
        its vLLM engine starts one process per device itself."""
        per_worker = self.generation.tp if self.rollout_devices else 1
        training = [DeviceBundle(self.training_processes)] * self.train_devices
        rollout = DeviceBundle((ROLLOUT_WORKER,), per_worker)
        return training + [rollout] * (self.rollout_devices // per_worker)


def placement_mode(config: MindRLConfig, offline: bool = False) -> str:
    """The run's mode: ``offline`` for stored samples, else ``rollout.placement``."""
    if offline:
        return OFFLINE
    return DISAGGREGATED if config.rollout.placement == DISAGGREGATED else COLLOCATED


def rollout_worker_spans_devices(config: MindRLConfig) -> bool:
    """Whether each disaggregated rollout worker holds several devices (``rollout.tp >
    1``): its engine then runs a process per device, which hold the weights and the KV
    cache, and the worker itself receives the weights into the host."""
    return placement_mode(config) == DISAGGREGATED and config.rollout.tp > 1


def training_devices(config: MindRLConfig, offline: bool = False) -> int:
    """Devices the model roles train on: the world, less the rollout workers' own."""
    if placement_mode(config, offline) == DISAGGREGATED:
        return config.world_size - config.rollout.devices
    return config.world_size


def resolve_layout(
    config: MindRLConfig, roles: tuple[str, ...] = ("actor",), offline: bool = False
) -> RunLayout:
    """The layout of ``roles`` (model roles, ``actor`` first) on ``config``'s devices."""
    mode = placement_mode(config, offline)
    train = training_devices(config, offline)
    rollout = config.rollout.devices if mode == DISAGGREGATED else 0
    generating = rollout if mode == DISAGGREGATED else train
    training = {role: training_layout(getattr(config, role), config.model, train) for role in roles}
    env_workers = config.env.worker_devices
    return RunLayout(
        mode=mode,
        train_devices=train,
        rollout_devices=rollout,
        training=training,
        generation=(
            None
            if mode == OFFLINE
            else GenerationLayout(generating, config.rollout.tp, config.rollout.ep)
        ),
        beside=(ENV_WORKER,) if env_workers == "shared" else (),
        # One environment worker per actor rank (run_plan.embodied_env_workers).
        env_devices=training["actor"].world if env_workers == "own" and "actor" in training else 0,
    )


def training_layout(section: RoleConfig, model: ModelConfig, world: int) -> TrainingLayout:
    """One role's section laid out over ``world`` devices."""
    parallel = section.parallel
    return TrainingLayout(
        world=world,
        tp=parallel.tp,
        pp=parallel.pp,
        cp=parallel.cp,
        ep=parallel.ep,
        etp=parallel.etp,
        first_stage_layers=parallel.first_stage_layers,
        stage_layers=tuple(stage_layer_counts(parallel, model.num_layers)),
        activation_checkpointing=section.activation_checkpointing,
    )


def stage_layer_counts(parallel: ParallelConfig, num_layers: int) -> list[int]:
    """Layers per pipeline stage: ``first_stage_layers`` first, the rest split evenly."""
    if parallel.pp == 1:
        return [num_layers]
    first = parallel.first_stage_layers
    if first is None:
        return [num_layers // parallel.pp] * parallel.pp
    return [first] + [(num_layers - first) // (parallel.pp - 1)] * (parallel.pp - 1)


# ---- the rules -------------------------------------------------------------------------
def layout_problems(layout: RunLayout, config: MindRLConfig) -> list[str]:
    """Every layout rule ``layout`` breaks, one line each naming the dotted keys."""
    problems: list[str] = []
    for role, training in layout.training.items():
        problems += training_problems(f"{role}.parallel", training, config.model)
    if layout.mode != OFFLINE:
        if layout.rollout_devices:  # whole weights reach the rollout workers: no resharder
            problems += generation_problems(
                config, layout.rollout_devices, "rollout.devices", resharded=False
            )
        else:
            problems += generation_problems(config, layout.train_devices)
    return problems


def training_problems(key: str, layout: TrainingLayout, model: ModelConfig) -> list[str]:
    """A training layout's sizes against its world and the model."""
    problems = []
    world, product = layout.world, layout.tp * layout.cp * layout.pp
    if world % product:
        problems.append(
            f"{key}: tp*cp*pp = {layout.tp}*{layout.cp}*{layout.pp} = {product} does not "
            f"divide the world size {world} (resources.nodes * resources.devices_per_node)"
        )
    problems += divides(
        f"{key}.tp", layout.tp, "model.num_attention_heads", model.num_attention_heads
    )
    if not model.uses_mla:
        problems += divides(f"{key}.tp", layout.tp, "model.num_kv_heads", model.num_kv_heads)
    problems += divides(f"{key}.tp", layout.tp, "model.ffn_hidden_size", model.ffn_hidden_size)
    problems += stage_layer_problems(key, layout, model)
    if model.is_moe:
        problems += divides(f"{key}.ep", layout.ep, "model.num_experts", model.num_experts)
        expert_product = layout.ep * layout.etp * layout.pp
        if world % expert_product:
            problems.append(
                f"{key}: ep*etp*pp = {expert_product} does not divide the world size {world}"
            )
    elif layout.ep > 1 or layout.etp > 1:
        problems.append(
            f"{key}.ep/etp: expert parallelism needs an MoE model (model.num_experts > 0)"
        )
    return problems


def stage_layer_problems(key: str, layout: TrainingLayout, model: ModelConfig) -> list[str]:
    """Every pipeline stage gets whole layers: ``pp`` divides them, or the layers after
    ``first_stage_layers`` split evenly over the other stages."""
    first = layout.first_stage_layers
    if first is None:
        return divides(f"{key}.pp", layout.pp, "model.num_layers", model.num_layers)
    rest = model.num_layers - first
    if layout.pp == 1 or rest <= 0 or rest % (layout.pp - 1):
        return [
            f"{key}.first_stage_layers: {first} leaves {rest} layers that do not split evenly over "
            f"the other {layout.pp - 1} pipeline stages of model.num_layers {model.num_layers}"
        ]
    return []


def generation_problems(
    config: MindRLConfig, world: int, what: str = "the world size", resharded: bool = True
) -> list[str]:
    """The generation layout over the ``world`` devices that generate (``what`` names
    them), against the model and, where the resharder builds each generation shard from a
    run of training shards (``resharded``), the actor's training TP."""
    rollout, model, train = config.rollout, config.model, config.actor.parallel
    problems = []
    if world % rollout.tp:
        problems.append(f"rollout.tp: {rollout.tp} does not divide {what} {world}")
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
            problems.append(f"rollout.ep: {rollout.ep} does not divide {what} {world}")
    elif rollout.ep > 1:
        problems.append("rollout.ep: expert parallelism needs an MoE model (model.num_experts > 0)")
    small, large = sorted((train.tp, rollout.tp))
    if resharded and large % small:
        problems.append(
            f"rollout.tp: generation TP {rollout.tp} and actor.parallel.tp {train.tp} must be "
            "multiples of one another so each generation shard is a run of training shards"
        )
    return problems


def placement_problems(config: MindRLConfig) -> list[str]:
    """Devices and staleness that only a disaggregated run reads, and its device count."""
    rollout, world = config.rollout, config.world_size
    if placement_mode(config) != DISAGGREGATED:
        problems = []
        if rollout.devices:
            problems.append(
                f"rollout.devices={rollout.devices} needs rollout.placement: disaggregated "
                "(collocated, every device generates); remove it or set the placement"
            )
        if rollout.max_staleness:
            problems.append(
                f"rollout.max_staleness={rollout.max_staleness} needs rollout.placement: "
                "disaggregated (collocated, generation and training take turns on the same "
                "devices, so nothing overlaps); set it, or rollout.max_staleness: 0"
            )
        return problems
    if rollout.devices < 1 or rollout.devices >= world:
        return [
            f"rollout.devices={rollout.devices}: a disaggregated run needs at least one device "
            f"to generate and one to train, and the cluster has {world} "
            f"(resources.nodes x resources.devices_per_node); set 1 <= rollout.devices <= "
            f"{world - 1}"
        ]
    return []


def divides(key: str, size: int, target_key: str, target: int) -> list[str]:
    if target % size:
        return [f"{key}: {size} does not divide {target_key} {target}"]
    return []
