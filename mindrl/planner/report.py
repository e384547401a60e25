"""The ``--dry-run`` plan: placement, layouts, memory per stage, sample flow, fit check.

Everything here is analytic: no accelerator, no Ray, no model weights are needed.
"""

from __future__ import annotations

from dataclasses import asdict

from backends.device import library_workspace_bytes
from mindrl.config import MindRLConfig
from mindrl.config.layout import DISAGGREGATED, GenerationLayout, TrainingLayout
from mindrl.dock.schema import RL_FIELDS, RUN_FIELDS
from mindrl.planner.checkpoint import checkpoint_plan
from mindrl.planner.memory import (
    MemoryPlan,
    plan_memory,
    resident_bytes,
    rollout_device_memory,
    rollout_device_peak,
)
from mindrl.planner.params import model_params
from mindrl.planner.sample_flow import (
    DockLayout,
    LinkFlow,
    SampleFlow,
    StageWorkers,
    link_flow,
    sample_flow,
    stored_sample_flow,
)
from mindrl.run_plan import EMBODIED, RunPlan, embodied_chunk_steps, embodied_env_workers

GB = 1e9


def planned_roles(plan: RunPlan) -> tuple[str, ...]:
    """Roles that hold device memory: the model roles plus the generation engine, if the
    run holds one."""
    if not plan.has_generation_engine:
        return plan.model_roles
    return (plan.model_roles[0], "rollout", *plan.model_roles[1:])


def plan_run_memory(
    config: MindRLConfig, plan: RunPlan, device_bytes: int, workspace: int = 0
) -> MemoryPlan:
    """The per-device memory of ``plan``'s stages (the dry run and the end-of-run check);
    ``workspace``: each process's library workspace on the device (:func:`plan_memory`).

    A role the plan offloads is not resident beside the actor's stages: its state waits
    on the host (:func:`offloaded_bytes`)."""
    resident = tuple(r for r in planned_roles(plan) if r not in plan.offloaded_roles)
    return plan_memory(config, device_bytes, resident, plan.has_generation_engine, workspace)


def offloaded_bytes(config: MindRLConfig, plan: RunPlan) -> dict[str, int]:
    """Per device, the bytes each offloaded role keeps on the host between its stages:
    the reference its weights, the critic its weights and optimizer state."""
    return {role: resident_bytes(config, role) for role in plan.offloaded_roles}


def response_fields(plan: RunPlan) -> int:
    """Per-token fields the dock stores for each response in this run."""
    return sum(1 for name in plan.written_fields() if RL_FIELDS[name].variable)


def stage_workers(config: MindRLConfig, plan: RunPlan) -> list[StageWorkers]:
    """Each stage's workers as this config places them (trainers/driver/setup.py): model
    ranks ``devices_per_node`` to a node in rank order, each data-parallel replica's first
    rank putting its results (a rollout TP group's first rank its responses); reward
    workers spread over the nodes (worker i on node i mod nodes; Ray's SPREAD where each
    node has a free CPU slot); the advantage stage on the first reward worker of each node
    taking the groups its node's warehouse stores for a group-local estimator, else on
    reward rank 0 alone."""
    per_node, layout = config.resources.devices_per_node, plan.layout
    reward_nodes = [i % config.resources.nodes for i in range(config.reward.workers)]
    out = []
    for stage in plan.stages:
        by_warehouse = False
        if stage.name == "advantage":
            by_warehouse = (
                plan.group_local_advantages
                and config.dock.local_claims
                and len(set(reward_nodes)) > 1
            )
            nodes = sorted(set(reward_nodes)) if by_warehouse else [0]
            parts, writers = list(range(len(nodes))), [True] * len(nodes)
        elif stage.role == "reward":
            nodes, parts = reward_nodes, list(range(config.reward.workers))
            writers = [True] * len(parts)
        elif stage.name == "rollout" and plan.has_generation_engine:
            first = layout.train_devices if plan.mode == DISAGGREGATED else 0
            ranks = range(first, first + layout.generation.world)
            tp = layout.generation.tp
            nodes = [r // per_node for r in ranks]
            parts = [(r - first) // tp for r in ranks]
            writers = [(r - first) % tp == 0 for r in ranks]
        else:
            role = layout.training[stage.role]
            ranks = range(role.world)
            nodes = [r // per_node for r in ranks]
            parts = [(r // role.tp) % role.dp for r in ranks]
            writers = [r % role.tp == 0 and r < role.tp * role.dp for r in ranks]
        out.append(StageWorkers(stage.name, stage.reads, stage.writes, tuple(nodes),
                                tuple(parts), tuple(writers), by_warehouse))  # fmt: skip
    return out


def layout_link_flow(
    config: MindRLConfig, plan: RunPlan, prompt_len: float | None = None,
    response_len: float | None = None, fetched_response_len: float | None = None,
) -> LinkFlow:  # fmt: skip
    """Bytes one iteration's sample flow puts on each node's link for this layout: a
    warehouse on each of the first ``dock.warehouses`` nodes (default all), every stage's
    controller, the driver and the reward workers on node 0. Lengths default to the
    config's maxima (an upper bound); a run's measured lengths make it a prediction of
    that run (``fetched_response_len``: the width a fetch pads responses to)."""
    prompt_len = config.rollout.max_prompt_length if prompt_len is None else prompt_len
    response_len = config.rollout.max_response_length if response_len is None else response_len
    fetched_len = response_len if fetched_response_len is None else fetched_response_len
    written = set(plan.written_fields())
    prompt_fields = tuple(
        f for f in dict.fromkeys(r for s in plan.stages for r in s.reads) if f not in written
    )

    def per_sample(field: str, length: float) -> float:
        spec = RUN_FIELDS[field]
        size = spec.numpy_dtype.itemsize
        if not spec.variable:
            return float(size)
        return size * (prompt_len if field in prompt_fields else length)

    fields = {f for s in plan.stages for f in (*s.reads, *s.writes)}
    stored = {f: per_sample(f, response_len) for f in fields}
    fetched = {f: per_sample(f, fetched_len) for f in fields}
    samples, prompt_repeat = config.data.global_batch_size * plan.group_size, plan.group_size
    if plan.runner == EMBODIED:  # chunk steps, put by the ranks that stepped them
        stored = fetched = chunk_step_field_bytes(config)
        samples, prompt_repeat = embodied_chunk_steps(config), 1
    nodes = config.resources.nodes
    layout = DockLayout(
        nodes=nodes,
        warehouse_nodes=tuple(range(min(config.dock.warehouses or nodes, nodes))),
        controller_nodes=dict.fromkeys(plan.stage_names, 0),
        local_claims=config.dock.local_claims,
    )
    return link_flow(
        stage_workers(config, plan), prompt_fields, samples, layout, stored, fetched,
        prompt_repeat=prompt_repeat,
    )  # fmt: skip


def chunk_step_field_bytes(config: MindRLConfig) -> dict[str, float]:
    """Bytes of each dock field of one embodied chunk step (``CHUNK_STEP_FIELDS``, and
    the value head's): the image, the state, the instruction (at most
    ``rollout.max_prompt_length`` words), the chunk's action ids and log-probs, its
    valid actions, and one advantage, value and return per unit of
    ``algorithm.reward_level``."""
    vla = config.model.vla
    actions = vla.chunk_size * vla.action_dims
    units = vla.chunk_size if config.algorithm.reward_level == "action" else 1
    widths = {
        "images": vla.image_size**2 * 3,
        "states": vla.state_dim,
        "prompt_ids": config.rollout.max_prompt_length,
        "response_ids": actions,
        "rollout_logprob": actions,
        "action_valid": vla.chunk_size,
        "advantages": units,
        "values": units,
        "returns": units,
    }
    return {f: float(n * RUN_FIELDS[f].numpy_dtype.itemsize) for f, n in widths.items()}


def run_sample_flow(config: MindRLConfig, plan: RunPlan) -> SampleFlow:
    """One iteration's sample flow: the paper's Eq. 2 for a run of prompts and
    responses; an embodied run's chunk steps at their fields' sizes."""
    warehouses, controllers = config.dock.warehouses or config.resources.nodes, len(plan.stages)
    if plan.runner == EMBODIED:
        fields = chunk_step_field_bytes(config)
        sample_bytes = sum(fields[f] for f in plan.stage("update").reads)
        samples = embodied_chunk_steps(config)
        return stored_sample_flow(samples, sample_bytes, warehouses, controllers)
    data = config.data
    return sample_flow(
        data.global_batch_size,
        plan.group_size,  # samples per prompt: the responses, or a stored pair's two
        config.rollout.max_prompt_length,
        config.rollout.max_response_length,
        response_fields(plan),
        warehouses,
        controllers,
    )


def layout_dict(layout: TrainingLayout) -> dict:
    return {key: getattr(layout, key) for key in ("tp", "pp", "cp", "dp", "ep", "etp", "edp")}


def placement(config: MindRLConfig, plan: RunPlan) -> list[dict]:
    """Per node (and, disaggregated, per device group on it): global ranks, the roles
    placed there, whether they train and generate, and the dock pieces the node hosts."""
    per_node = config.resources.devices_per_node
    warehouses = config.dock.warehouses or config.resources.nodes
    nodes = []
    for node in range(config.resources.nodes):
        first, last = node * per_node, (node + 1) * per_node - 1
        dock = {
            "td_warehouse": node < warehouses,
            "td_controllers": list(plan.stage_names) if node == 0 else [],
        }
        if plan.mode != DISAGGREGATED:
            roles = list(planned_roles(plan))
            nodes.append(device_group(node, first, last, roles, True, plan.generates, dock))
            continue
        # Disaggregated runs are single-node (config check): trainers first, then rollout.
        split = first + plan.layout.train_devices
        trainers = list(plan.model_roles)
        nodes.append(device_group(node, first, split - 1, trainers, True, False, dock))
        shown_once = {**dock, "td_controllers": []}  # the node's, listed on the row above
        nodes.append(device_group(node, split, last, ["rollout"], False, True, shown_once))
    return nodes


def device_group(
    node: int, first: int, last: int, roles: list[str], trains: bool, generates: bool, dock: dict
) -> dict:
    return {"node": node, "ranks": [first, last], "roles": roles, **dock} | {
        "trains": trains,
        "generates": generates,
    }


def device_processes(plan: RunPlan) -> list[dict]:
    """The placement decision per kind of device: the worker processes that share it
    (one per role, each holding its share of the device) and which of them the fit check
    offloads to the host between their stages."""
    kinds: dict[tuple[str, ...], int] = {}
    for roles in plan.layout.device_processes():
        kinds[roles] = kinds.get(roles, 0) + 1
    return [
        {
            "devices": count,
            "processes": list(roles),
            "offloaded": [role for role in roles if role in plan.offloaded_roles],
        }
        for roles, count in kinds.items()
    ]


def host_swap_bytes(memory: MemoryPlan, config: MindRLConfig, plan: RunPlan) -> int:
    """Host bytes one node pins for allgather-swap: every device's swapped training state."""
    if plan.mode == DISAGGREGATED:  # nothing generates on the training devices: no swap
        return 0
    return memory.swap_bytes * config.resources.devices_per_node if config.rollout.swap else 0


def host_offload_bytes(config: MindRLConfig, plan: RunPlan) -> int:
    """Host bytes one node pins for the offloaded roles of every device on it."""
    per_device = sum(offloaded_bytes(config, plan).values())
    return per_device * config.resources.devices_per_node


def fit_problems(
    memory: MemoryPlan, config: MindRLConfig, plan: RunPlan, host_bytes: int
) -> list[str]:
    """Stages that do not fit in one device (or the swap in one host), with the shortfall."""
    problems = []
    pinned = host_swap_bytes(memory, config, plan)
    offloaded = host_offload_bytes(config, plan)
    if pinned + offloaded > host_bytes:
        what = "allgather-swap and the offloaded roles pin" if offloaded else "allgather-swap pins"
        problems.append(
            f"{what} {(pinned + offloaded) / GB:.1f} GB of host memory per node "
            f"({config.resources.devices_per_node} devices), more than the "
            f"{host_bytes / GB:.1f} GB available; set resources.host_memory_gib to the "
            "nodes' memory, or turn actor.swap_optimizer off"
        )
    if memory.training_stage_total > memory.device_bytes:
        over = (memory.training_stage_total - memory.device_bytes) / GB
        roles = "".join(f" + {role}" for role in memory.other_roles)
        problems.append(
            f"training stage (actor{roles}) needs {memory.training_stage_total / GB:.1f} GB "
            "per device, "
            f"{over:.1f} GB more than the {memory.device_bytes / GB:.1f} GB available"
        )
    if plan.has_generation_engine:
        problems += generation_problems(memory, config, plan)
    return problems


def generation_problems(memory: MemoryPlan, config: MindRLConfig, plan: RunPlan) -> list[str]:
    """The generation stage's shortfall: no room left for the KV cache."""
    problems = []
    generation = memory.generation_swap if config.rollout.swap else memory.generation_naive
    if plan.mode == DISAGGREGATED:
        generation = rollout_device_memory(config, memory.device_bytes)
        peak = rollout_device_peak(config, memory)
        if peak > memory.device_bytes:
            problems.append(
                f"a rollout device needs {peak / GB:.1f} GB (the engine's weights and working "
                f"memory, and the next weights as they arrive) of its "
                f"{memory.device_bytes / GB:.1f} GB: lower rollout.memory_fraction (or "
                "rollout.kv_cache_mib) to leave room for one more copy of the weights"
            )
    if generation.kv_cache_budget <= 0:
        over = -generation.kv_cache_budget / GB
        problems.append(
            f"generation stage leaves no KV cache: weights and resident training state "
            f"exceed rollout.memory_fraction of the device by {over:.1f} GB"
        )
    if memory.rollout is not None and memory.rollout_stage_total > memory.device_bytes:
        steps = asdict(memory.rollout)
        step = max(steps, key=steps.get)
        over = (memory.rollout_stage_total - memory.device_bytes) / GB
        problems.append(
            f"rollout stage needs {memory.rollout_stage_total / GB:.1f} GB per device at its "
            f"{step} step (the actor + resident roles), {over:.1f} GB more than the "
            f"{memory.device_bytes / GB:.1f} GB available; {ROLLOUT_STEP_FIX[step]}"
        )
    return problems


#: What shrinks each rollout step (mindrl/planner/memory.py, rollout_steps).
ROLLOUT_STEP_FIX = {
    "reshard": "lower rollout.reshard_bucket_mib, or raise actor.parallel.tp",
    "load": "lower rollout.kv_cache_mib or rollout.memory_fraction, or raise rollout.tp / ep",
    "generate": "lower rollout.kv_cache_mib or rollout.memory_fraction, or raise rollout.tp / ep",
    "swap_in": "raise actor.parallel.tp or turn on the distributed optimizer",
}


def environments(config: MindRLConfig, plan: RunPlan) -> dict | None:
    """An embodied run's simulators: how many, how many per actor rank, where they step
    (``env.placement``) in how many pipeline stages, and the environment workers (one
    CPU slot each) that takes; None for a run without them."""
    env = config.env
    if not env.embodied:
        return None
    dp = plan.layout.training["actor"].dp or 1
    return {
        "class": env.cls,
        "num_envs": env.num_envs,
        "per_rank": env.num_envs // dp,
        "placement": env.placement,
        "pipeline_stages": env.pipeline_stages,
        "env_workers": embodied_env_workers(config, plan),
        "device": env.device,
    }


def build_plan(
    config: MindRLConfig,
    plan: RunPlan,
    device_name: str,
    device_bytes: int,
    host_bytes: int,
) -> dict:
    """The whole plan as a JSON-serialisable dict."""
    memory = plan_run_memory(config, plan, device_bytes, library_workspace_bytes(device_name))
    flow = run_sample_flow(config, plan)
    params = model_params(config.model)
    return {
        "trainer": plan.trainer,
        "generates": plan.generates,
        "device": device_name,
        "world_size": config.world_size,
        "mode": plan.mode,
        "max_staleness": config.rollout.max_staleness,
        "nodes": config.resources.nodes,
        "devices_per_node": config.resources.devices_per_node,
        "placement": placement(config, plan),
        "device_processes": device_processes(plan),
        "model": {
            "family": config.model.family,
            "params": params.total,
            "tp_params": params.tp,
            "expert_params": params.expert,
            "replicated_params": params.replicated,
            "dtype": config.model.dtype,
        },
        "training_layouts": {
            role: layout_dict(layout) for role, layout in plan.layout.training.items()
        },
        "generation_layout": generation_layout(plan.layout.generation),
        "memory": {
            **memory.as_dict(),
            "host_bytes": host_bytes,
            "host_swap_bytes": host_swap_bytes(memory, config, plan),
            "offloaded_roles": offloaded_bytes(config, plan),
            "host_offload_bytes": host_offload_bytes(config, plan),
            "rollout_devices": (
                {
                    **asdict(rollout_device_memory(config, device_bytes)),
                    "peak": rollout_device_peak(config, memory),
                }
                if plan.mode == DISAGGREGATED
                else None
            ),
        },
        "sample_flow": flow.as_dict(),
        "link_flow": layout_link_flow(config, plan).as_dict(),
        "checkpoint": checkpoint_plan(config, plan),
        "environments": environments(config, plan),
        "allgather_swap": config.rollout.swap and plan.has_generation_engine,
        "fit_problems": fit_problems(memory, config, plan, host_bytes),
    }


def generation_layout(layout: GenerationLayout | None) -> dict | None:
    """The generation layout (None: nothing generates)."""
    if layout is None:
        return None
    return {"tp": layout.tp, "ep": layout.ep, "dp": layout.dp, "pp": 1}
