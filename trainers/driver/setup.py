"""Starting and stopping a run: Ray, the dock, the worker groups, resume.

Placement (paper, "all-colocated"; the run plan's ``RunLayout.device_processes``): the
run's devices are one Ray placement group of one bundle per device
(mindrl/workers/placement.py); rank ``r`` of the actor, reference and critic share device
``r``, each process holding its share of it, and the rollout runs in the actor's
processes (disaggregated: rollout workers on devices of their own, one bundle each);
reward workers are CPU processes, spread over the nodes; the dock puts one warehouse on
every node and each stage's controller on the node of the first worker that serves the
stage.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import remove_placement_group

from backends.device import Device, get_device, library_workspace_bytes
from backends.megatron import checkpoint
from mindrl.config.layout import DISAGGREGATED, ROLLOUT_WORKER
from mindrl.config.schema import ENV_DISAGGREGATED, MindRLConfig
from mindrl.config.specs import engine_specs, vla_spec
from mindrl.config.validate import is_vla
from mindrl.data import PromptDataset, PromptRecord, load_tokenizer
from mindrl.data.pairs import pair_dataset
from mindrl.data.run_prompts import prompt_dataset
from mindrl.dock import DockClient, FieldSpec, create_dock, shutdown_dock
from mindrl.dock.schema import RUN_FIELDS
from mindrl.envs import EnvConfigError, load_env_class
from mindrl.envs.demonstrations import load_demonstrations
from mindrl.envs.embodied import load_vector_env_class, make_vector_env
from mindrl.envs.stages import EnvDescription
from mindrl.planner.capacity import CapacityError, device_bytes, host_bytes
from mindrl.planner.offload import plan_offload
from mindrl.planner.render import environments_line
from mindrl.planner.report import environments
from mindrl.rewards.routing import reward_problems, reward_spec_of, served_judge, unrouted_problem
from mindrl.run_plan import RunPlan, build_run_plan, embodied_env_workers
from mindrl.workers.context import model_context, stage_context
from mindrl.workers.embodied_setup import check_fits
from mindrl.workers.env_worker import env_worker_class
from mindrl.workers.group import WorkerGroup, first_line, wait_all
from mindrl.workers.judge_server import JudgeServer
from mindrl.workers.placement import DevicePlacement
from mindrl.workers.reward import RewardWorker
from mindrl.workers.roles import ModelWorker
from mindrl.workers.vector_env_worker import reserve_env_workers
from trainers.driver.rollout_placement import connect_rollout_workers, start_rollout_workers
from trainers.driver.state import RunState
from trainers.kl_control import make_kl_controller
from trainers.registry import get_algorithm

#: The dock's fields: the RL fields plus the prompt's record (for the ground truth).
FIELDS: dict[str, FieldSpec] = RUN_FIELDS


class RunSetupError(ValueError):
    """The run cannot start as configured; the message says what to change."""


def prepare_run(config: MindRLConfig, trainer: str, resume: bool | str) -> RunState:
    """Check the config and build the driver's state (prompts, algorithm); no Ray yet.

    ``resume``: True continues from the latest checkpoint, a path (--resume-from) from that
    one; either is checked here, before any process starts.
    """
    algorithm = get_algorithm(trainer)
    _preflight(config, algorithm.offline)
    run_dir = Path(config.logging.dir.format(trainer=trainer))
    checkpoint_dir = Path(config.checkpoint.dir or run_dir / "checkpoints")
    plan = build_run_plan(algorithm, config)
    options = plan.options
    resume_steps = _resume_steps(checkpoint_dir, resume, plan) if resume else {}
    dataset, eos = _dataset(config, plan.offline)
    run = RunState(
        config=config,
        trainer=trainer,
        algorithm=algorithm,
        options=options,
        plan=plan,
        kl=make_kl_controller(
            options.kl_coef, options.adaptive_kl, options.kl_target, options.kl_horizon
        ),
        run_dir=run_dir,
        checkpoint_dir=checkpoint_dir,
        dataset=dataset,
        dataset_eos=eos,
        resume_steps=resume_steps,
    )
    return run


def _resume_steps(checkpoint_dir: Path, resume: bool | str, plan: RunPlan) -> dict[str, Path]:
    """The checked step folder of every trained role (``resume``: True for the run's latest,
    or a path from --resume-from), before any process starts."""
    source = checkpoint_dir if resume is True else Path(resume)
    roles = [role for role in ("actor", "critic") if role in plan.model_roles]
    if resume is True and not (checkpoint_dir / "actor" / "latest").exists():
        raise RunSetupError(
            f"--resume: no checkpoint under {checkpoint_dir}; run without --resume to start afresh"
        )
    try:
        return checkpoint.resolve_run(source, roles)
    except checkpoint.CheckpointError as exc:
        raise RunSetupError(f"--resume: {exc}") from None


def launch_run(
    run: RunState,
    device_name: str,
    resume: bool | str,
    on_connected: Callable[[], None] | None = None,
) -> None:
    """Connect Ray, start the dock and the workers, and resume if asked.

    Each phase prints one line first: a large model's start-up takes minutes (imports,
    weight conversion), and a hang should name the phase it hangs in. ``on_connected``
    runs once Ray is connected (``ray.init`` replaces the driver's SIGTERM handler).
    """
    started = time.perf_counter()

    def phase(text: str) -> None:
        print(f"start-up [{time.perf_counter() - started:5.1f} s] {text}", file=sys.stderr)

    run.plan = _offload_if_needed(run, device_name, phase)
    phase(f"connecting to Ray ({_ray_address(run.config) or 'local'})")
    run.ray_started_here = _connect_ray(run.config, device_name, run.plan)
    if on_connected is not None:
        on_connected()
    plan = run.plan
    reward = "" if plan.offline or run.config.env.embodied else ", reward"
    if embodied_env_workers(run.config, plan):  # the actor's ranks start them
        reward = f", env x {embodied_env_workers(run.config, plan)} (with the actor)"
    rollout = f", rollout x {plan.layout.rollout_devices}" if plan.mode == DISAGGREGATED else ""
    trainers = f"{' + '.join(plan.model_roles)} x {plan.layout.train_devices}"
    phase(f"starting worker processes: {trainers}{rollout}{reward}")
    _place_workers(run, device_name)
    phase("starting the transfer dock")
    _start_dock(run, _controller_nodes(run))
    phase("building engines and loading weights (every role, together)")
    _setup_workers(run)
    if resume:
        phase(f"resuming from {run.resume_steps['actor']}")
        _resume(run)
    if plan.mode == DISAGGREGATED:
        phase("connecting the rollout workers and sending them the weights")
        connect_rollout_workers(run)
    phase("ready")
    _write_placement(run)
    _announce(run, device_name)


def _offload_if_needed(run: RunState, device_name: str, say: Callable[[str], None]) -> RunPlan:
    """The plan with the roles the planner's fit check offloads (mindrl/planner/offload.py)
    on this device; all resident where the device's memory cannot be learned here."""
    try:
        per_device = device_bytes(run.config, device_name)
    except CapacityError as exc:
        say(f"every role stays resident on its device: {exc}")
        return run.plan
    workspace = library_workspace_bytes(device_name)
    plan = plan_offload(run.config, run.plan, per_device, host_bytes(run.config), workspace)
    if plan.offloaded_roles:
        roles = " and ".join(plan.offloaded_roles)
        say(f"{roles} wait on the host between their stages (the plan does not fit resident)")
    return plan


def _preflight(config: MindRLConfig, offline: bool) -> None:
    """What the config names outside itself (reward functions, environment, folders,
    packages) exists here; every missing one is reported, one line each. The config's own
    consistency, engine capabilities included, is the validator's
    (mindrl/config/validate.py)."""
    # An embodied run is rewarded by its environment's steps: no reward functions.
    problems = [] if offline or config.env.embodied else reward_problems(config)
    load_class = load_vector_env_class if config.env.embodied else load_env_class
    if config.env.cls is not None:
        try:
            load_class(config.env.cls)  # the workers import it the same way
            if config.env.embodied and is_vla(config):  # a text model is refused at load
                _check_policy_fits(config)
        except EnvConfigError as exc:
            problems.append(str(exc))
    reward_model = config.reward.reward_model
    if reward_model and not Path(reward_model).is_dir():
        problems.append(f"reward.reward_model {reward_model!r} is not a folder")
    model = config.model
    if model.hf_path and not Path(model.hf_path).is_dir():
        problems.append(f"model.hf_path {model.hf_path!r} is not a folder")
    if model.gguf_package:
        from backends.megatron.hf_io import find_gguf

        try:
            find_gguf(model.gguf_package)
        except FileNotFoundError as exc:
            problems.append(f"model.gguf_package: {exc}")
    if problems:
        raise RunSetupError("\n".join(problems))


def _check_policy_fits(config: MindRLConfig) -> None:
    """One environment of the run's class reads and writes what the policy does (image
    size, state and action dimensions, chunk size, the instruction's vocabulary), checked
    here so a mismatch stops the run in one line before any worker starts.

    Raises:
        EnvConfigError: the first mismatch, naming the setting that fixes it.
    """
    env = config.env
    one = make_vector_env(
        env.cls, num_envs=1, chunk_size=env.chunk_size, horizon=env.horizon, kwargs=env.kwargs
    )
    try:
        description = EnvDescription.of(one)
        if env.clones_expert and description.has_expert:
            one.expert_actions()  # an expert that cannot give this run's chunks says so now
        vla = vla_spec(config.model)
        check_fits(description, env.chunk_size, vla, config.model.vocab_size, env.clones_expert)
        if env.clone_data:  # with clone_steps: refused at load otherwise
            load_demonstrations(
                env.clone_data, description.observation_spec, env.chunk_size, vla.action_dims
            )
    finally:
        one.close()


def _dataset(config: MindRLConfig, offline: bool = False) -> tuple[PromptDataset, int]:
    """The prompts (an offline run's: its pairs), and the tokenizer's end-of-sequence id
    (generation stops there; a pair's responses end with it)."""
    try:
        tokenizer = load_tokenizer(config.model.tokenizer)
        dataset = (pair_dataset if offline else prompt_dataset)(config, tokenizer)
    except ValueError as exc:
        raise RunSetupError(str(exc)) from None
    if not offline and not config.env.enabled and not config.env.embodied:
        _check_domains(config, dataset.records)
    return dataset, tokenizer.eos_token_id


def _check_domains(config: MindRLConfig, records: list[PromptRecord]) -> None:
    """Every domain of the data has a route (a sample without one could only fail).

    Raises:
        RunSetupError: the first domain without a route, with three of its rows.
    """
    spec = reward_spec_of(config.reward)
    problem = unrouted_problem(spec, [r.domain for r in records], [r.uid for r in records])
    if problem is not None:
        raise RunSetupError(problem)


def _ray_address(config: MindRLConfig) -> str | None:
    """The cluster to join: the config's, else ``$RAY_ADDRESS``; None starts a local one."""
    return config.resources.ray_address or os.environ.get("RAY_ADDRESS")


def _connect_ray(config: MindRLConfig, device_name: str, plan: RunPlan) -> bool:
    """Join the configured cluster or start a local one; True when started here."""
    if ray.is_initialized():
        return False
    address = _ray_address(config)
    quiet = {"logging_level": "ERROR", "log_to_driver": True}
    if address:
        try:
            ray.init(address=address, **quiet)
        except (ConnectionError, RuntimeError) as exc:
            raise RunSetupError(
                f"cannot join the Ray cluster at {address!r} ({first_line(exc)}); start it with "
                "`ray start --head` on the first node, or unset resources.ray_address / "
                "RAY_ADDRESS; a cluster with token auth (the `ray start` default since Ray "
                "2.59) also needs RAY_AUTH_MODE=token and its token (~/.ray/auth_token)"
            ) from None
        return False
    # address="local": a new instance, never a cluster some other job started here.
    kwargs: dict[str, Any] = {"address": "local", "include_dashboard": False, **quiet}
    # The workers are the job: start them at the command's own priority. Ray's raylet
    # otherwise renices every worker by +15 (RAY_worker_niceness), so on a shared machine
    # they yield to any other process and a `nice mindrl-train` reaches the driver only.
    os.environ.setdefault("RAY_worker_niceness", "0")
    if get_device(device_name).ray_resource == "CPU":
        # On a CPU a worker's "device" is a Ray CPU slot: the plan's devices need that many
        # slots even where there are fewer cores (the roles on one take turns on it).
        kwargs["num_cpus"] = max(os.cpu_count() or 1, cpu_slots(config, plan))
    try:
        ray.init(**kwargs)
    except Exception as exc:  # Ray raises a bare Exception when its node does not start
        raise RunSetupError(
            f"could not start a local Ray instance ({first_line(exc)}); an overloaded machine "
            "or a full /tmp delays its processes: retry, or start Ray yourself with "
            "`ray start --head` and set RAY_ADDRESS=auto"
        ) from None
    return True


def cpu_slots(config: MindRLConfig, plan: RunPlan) -> int:
    """Ray CPU slots a run on the CPU reserves: one per device of the plan (every process
    on a device holds a share of its slot), one per reward worker, one per environment
    worker and one for a judge model it serves."""
    judge = int(not plan.offline and serves_judge(config))
    reward = 0 if config.env.embodied else config.reward.workers
    return plan.layout.devices + reward + env_workers(config, plan) + judge


def serves_judge(config: MindRLConfig) -> bool:
    """The run serves its judge model (``reward.judge.model``) in a worker of its own."""
    if config.env.enabled or not config.reward.judge.get("model"):
        return False
    return served_judge(reward_spec_of(config.reward), config.reward.judge)


def env_workers(config: MindRLConfig, plan: RunPlan) -> int:
    """Environment workers a run places on CPU slots of their own: a text run's
    ``env.workers``; an embodied run's (``run_plan.embodied_env_workers``) unless they
    hold devices (``env.device: accelerator``: the layout counts those)."""
    if config.env.embodied:
        return 0 if config.env.worker_devices else embodied_env_workers(config, plan)
    return config.env.workers if config.env.enabled else 0


def _controller_nodes(run: RunState) -> dict[str, str]:
    """Stage -> node of the first worker serving it (paper: controllers sit with workers)."""
    return {stage: run.worker_nodes[group] for stage, group in run.plan.stage_roles().items()}


def _start_dock(run: RunState, controller_nodes: dict[str, str]) -> None:
    plan = run.plan
    run.dock_handle = create_dock(
        FIELDS,
        plan.dock_stages(),
        n_samples=plan.dock_groups * plan.group_size,
        group_size=plan.group_size,
        warehouses=run.config.dock.warehouses,
        kind=run.config.dock.kind,
        timeout_s=run.config.dock.timeout_s,
        controller_nodes=controller_nodes,
        nodes=_dock_nodes(run),
    )
    run.dock = DockClient(run.dock_handle)


def _dock_nodes(run: RunState) -> list[str]:
    """The nodes of the run's devices (its model ranks and rollout workers), each once,
    in rank order: a warehouse on a node without them would hold samples every worker
    reaches over the network (and, on a shared test cluster, cost a process per run for
    nothing). Reward workers, which Ray may place on any node with a free CPU, do not
    add one: the warehouses, hence which rank claims which samples, follow the device
    placement alone, so one config trains the same wherever its CPU workers land."""
    device_roles = [*run.plan.model_roles, ROLLOUT_WORKER]
    ranks = [node for role in device_roles for node in run.rank_nodes.get(role, [])]
    return list(dict.fromkeys(ranks))


def _place_workers(run: RunState, device_name: str) -> None:
    """Start every worker group (placement groups, processes); engines come later.

    Every group is started before the driver waits on any: a process's start is mostly
    its imports (seconds each), and waiting on one role before starting the next would
    add those seconds up role by role instead of letting the processes start together.
    """
    config, plan, device = run.config, run.plan, get_device(device_name)
    run.placement = DevicePlacement(
        device, plan.layout, config.resources.cpus_per_worker, strategy=_model_placement(config)
    )
    if config.env.embodied and config.env.placement == ENV_DISAGGREGATED:
        workers = embodied_env_workers(config, plan)
        own = device if config.env.worker_devices == "own" else None
        run.env_workers = reserve_env_workers(workers, plan.stage_deadline_s, own)
    started: dict[str, dict[str, Any]] = {}  # group -> worker name -> its start-up call
    for role in plan.model_roles:
        specs = engine_specs(
            getattr(config, role), plan.layout.training[role], _steps(config, role)
        )
        context = model_context(plan, role, config, run.algorithm, specs)
        group = run.placement.start(role, ray.remote(ModelWorker), (context, device_name))
        run.groups[role] = group
        run.rank_nodes[role] = run.placement.nodes_of(role)
        started[role] = {group.names()[0]: group.workers[0].rendezvous.remote()}
    if plan.mode == DISAGGREGATED:
        group = start_rollout_workers(run, device_name, run.placement)
        run.groups[ROLLOUT_WORKER] = group
        started[ROLLOUT_WORKER] = _node_ids(group)
    for group in _cpu_worker_groups(run, device):
        run.groups[group.name] = group
        started[group.name] = _node_ids(group)
    answers = _start_up_answers(started, plan.stage_deadline_s)
    for role in plan.model_roles:
        (rendezvous,) = answers[role]
        run.rendezvous[role] = rendezvous[:2]
        run.worker_nodes[role] = rendezvous[2]
    for name in (ROLLOUT_WORKER, "reward"):  # each worker's node: it claims beside it
        if name in answers:
            run.rank_nodes[name] = answers[name]
            run.worker_nodes[name] = answers[name][0]


def _node_ids(group: WorkerGroup) -> dict[str, Any]:
    """Worker name -> its ``node_id`` call (the node each worker started on)."""
    return {
        name: worker.node_id.remote()
        for name, worker in zip(group.names(), group.workers, strict=True)
    }


def _cpu_worker_groups(run: RunState, device: Device) -> list[WorkerGroup]:
    """The run's groups beside the model roles: the judge model it serves (one device of
    its own; a CPU slot on the CPU), reward workers (none offline: stored pairs carry their
    preference), spread over the nodes so each scores (and, for a group-local estimator,
    computes advantages for) what its own node's warehouse stores; environment workers."""
    config, groups = run.config, []
    judge = None
    if not run.plan.offline and serves_judge(config):
        on_device = None if device.ray_resource == "CPU" else device
        server = WorkerGroup(
            "judge", ray.remote(JudgeServer), 1, on_device,
            args=(config.reward.judge, config.rollout.engine),
        )  # fmt: skip
        groups.append(server)
        judge = server.workers[0]
    if not run.plan.offline and not config.env.embodied:  # embodied: the env rewards
        groups.append(
            WorkerGroup(
                "reward",
                ray.remote(RewardWorker),
                config.reward.workers,
                None,
                args=(stage_context(run.plan, "reward", config, run.algorithm), judge),
                strategy="SPREAD" if config.resources.nodes > 1 else "PACK",
            )
        )
    if config.env.enabled:
        env = config.env
        groups.append(
            WorkerGroup("env", env_worker_class(), env.workers, None, args=(env.cls, env.kwargs))
        )
    return groups


def _start_up_answers(started: dict[str, dict[str, Any]], timeout_s: float) -> dict[str, list[Any]]:
    """Every group's start-up answers in rank order, waited on together (the first death
    raises, naming its worker)."""
    refs = [ref for calls in started.values() for ref in calls.values()]
    names = [name for calls in started.values() for name in calls]
    answers = iter(wait_all(refs, names, "start-up", timeout_s))
    return {name: [next(answers) for _ in calls] for name, calls in started.items()}


def _model_placement(config: MindRLConfig) -> str:
    """The device placement group's strategy: one device per node spreads the devices over
    the nodes. PACK does that on accelerators (a node has one device), but on a CPU a
    device is a CPU slot, and a node with a reward worker's slot too would take two."""
    resources = config.resources
    return "SPREAD" if resources.nodes > 1 and resources.devices_per_node == 1 else "PACK"


def _setup_workers(run: RunState) -> None:
    """Every model group joins its own process group and builds its engines, together."""
    timeout = run.plan.stage_deadline_s
    pending = {
        role: [
            w.setup.remote(*run.rendezvous[role], run.dock_handle) for w in run.groups[role].workers
        ]
        for role in run.plan.model_roles
    }
    for role, refs in pending.items():
        names = [f"{role}[{r}]" for r in range(len(refs))]
        infos = wait_all(refs, names, "start-up", timeout)
        run.dp_ranks[role] = [info["dp_rank"] for info in infos]
        run.rank_nodes[role] = [info["node_id"] for info in infos]
        if role == "actor":
            run.gen_dp_ranks = [info["gen_dp_rank"] for info in infos]
    if "reward" in run.groups:
        run.groups["reward"].call("attach", run.dock_handle, stage="start-up", timeout_s=timeout)
    if "env" in run.groups:  # the actor's ranks run the episodes with them
        workers = run.groups["env"].workers
        run.groups["actor"].call("attach_env_workers", workers, stage="start-up", timeout_s=timeout)


def _steps(config: MindRLConfig, role: str) -> int | None:
    """Optimizer steps ``role`` takes over the run (its LR schedule's length); ``None``
    for the reference, which does not train."""
    if role == "reference":
        return None
    return _updates_per_iteration(config, role) * config.iterations


def _updates_per_iteration(config: MindRLConfig, role: str) -> int:
    """Optimizer steps ``role`` takes per iteration (its LR schedule's unit): its own
    epochs x mini-batches; the critic's may differ from the actor's."""
    section = getattr(config, role)
    prompts = config.data.global_batch_size
    per_step = section.mini_batch_size or prompts
    return section.ppo_epochs * -(-prompts // per_step)


def _resume(run: RunState) -> None:
    timeout = run.plan.stage_deadline_s
    positions = []
    for role, step_dir in run.resume_steps.items():
        positions += run.groups[role].call(
            "load_checkpoint", str(step_dir), stage="resume", timeout_s=timeout
        )
    iterations = {p["next_iteration"] for p in positions}
    if len(iterations) != 1:
        raise RunSetupError(
            f"checkpoints under {run.checkpoint_dir} disagree on the iteration "
            f"({sorted(iterations)}); remove the newer role's latest step or start afresh"
        )
    position = positions[0]
    run.dataset.load_state_dict(position["dataset"])
    run.kl.value = position["kl_coef"]
    # A checkpoint from before samples were kept in flight has none: nothing to restore.
    run.in_flight = position.get("in_flight")
    run.start_iteration = position["next_iteration"]
    run.finished_iteration = run.start_iteration - 1
    run.resumed = True


#: Where every worker and warehouse of a run started, in its run folder.
PLACEMENT_FILE = "placement.json"


def _write_placement(run: RunState) -> None:
    """``placement.json``: each role's node per rank (model roles, rollout and reward
    workers), each warehouse's node, and the address of every node they use; what to
    look at first when one node of a cluster is slow or dies."""
    addresses = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}
    warehouses = [warehouse.node_id for warehouse in run.dock_handle.warehouses]
    used = {node for nodes in run.rank_nodes.values() for node in nodes} | set(warehouses)
    placement = {
        "ranks": run.rank_nodes,
        "warehouses": warehouses,
        "addresses": {node: addresses.get(node) for node in sorted(used)},
    }
    run.run_dir.mkdir(parents=True, exist_ok=True)
    (run.run_dir / PLACEMENT_FILE).write_text(json.dumps(placement, indent=2) + "\n")


def _announce(run: RunState, device_name: str) -> None:
    config = run.config
    actor = config.actor.parallel
    nodes = len({w.node_id for w in run.dock_handle.warehouses})
    lines = [
        f"mindrl-train {run.trainer}: {config.world_size} {device_name} ranks; actor TP{actor.tp} "
        f"PP{actor.pp} {f'CP{actor.cp} ' if actor.cp > 1 else ''}"
        f"DP{len(set(run.dp_ranks['actor']))} -> {_generation_line(run)}",
        f"  roles {', '.join(run.groups)}; dock {config.dock.kind} with "
        f"{len(run.dock_handle.warehouses)} warehouse(s) on {nodes} node(s)",
        f"  metrics and {PLACEMENT_FILE} -> {run.run_dir}; checkpoints -> {run.checkpoint_dir}"
        + (f"; resuming at iteration {run.start_iteration}" if run.resumed else ""),
    ]
    print("\n".join(lines), file=sys.stderr)


def _generation_line(run: RunState) -> str:
    """What generates: nothing (stored pairs), the actor's ranks stepping their share of
    an embodied run's environments, or the rollout engine."""
    config = run.config
    if run.plan.offline:  # which pairs and how many: a file not the one meant shows here
        return f"no generation ({len(run.dataset.records)} stored pairs from {config.data.source})"
    if config.env.embodied:
        where = environments_line(environments(config, run.plan))
        return f"{where} (generation: the policy's own forward)"
    return f"rollout TP{config.rollout.tp} DP{len(set(run.gen_dp_ranks))} ({config.rollout.engine})"


def stop_run(run: RunState) -> None:
    """Kill the workers and the dock; shut Ray down only if this run started it."""
    for group in run.groups.values():
        group.shutdown()
    if run.placement is not None:
        run.placement.remove()
    if run.env_workers is not None:
        remove_placement_group(run.env_workers)
    if run.dock_handle is not None:
        shutdown_dock(run.dock_handle)
    if run.ray_started_here:
        ray.shutdown()
