"""What an embodied actor rank builds its environments with and checks them against:
its stages, in place or in an environment worker (``env.placement``), and whether the
policy reads and writes what they observe and take."""

from __future__ import annotations

from backends.device import Device
from backends.megatron.families.vla import ACTION_BINS, VLASpec
from mindrl.config.layout import resolve_layout
from mindrl.config.schema import ENV_DISAGGREGATED, ENV_WORKER_PLACEMENTS, MindRLConfig
from mindrl.envs.embodied import EnvConfigError, no_expert_line
from mindrl.envs.stages import EnvDescription, SimulatorStages, StageLayout, build_stages
from mindrl.workers.placement import bundle_share
from mindrl.workers.vector_env_worker import EnvWorkerPlace, start_remote_stages


def check_fits(
    env: EnvDescription, chunk_size: int, vla: VLASpec, vocab_size: int, clones: bool = False
) -> None:
    """The environment's observations and actions (``env``, stepped ``chunk_size``
    actions at a time) are what the policy reads and writes, and, where the run
    ``clones`` a scripted expert first, it has one.

    Raises:
        EnvConfigError: one line naming the first mismatch and the setting that fixes it.
    """
    spec, actions, name = env.observation_spec, env.action_spec, env.name
    if spec.image_height != spec.image_width:
        raise EnvConfigError(
            f"{name} renders {spec.image_height}x{spec.image_width} images; the vla policy "
            "reads square ones"
        )
    pairs = (
        ("image_size", vla.image_size, spec.image_height),
        ("state_dim", vla.state_dim, spec.state_dim),
        ("action_dims", vla.action_dims, actions.dims),
        ("chunk_size", vla.chunk_size, chunk_size),
    )
    for key, policy_value, env_value in pairs:
        if policy_value != env_value:
            raise EnvConfigError(
                f"model.vla.{key}={policy_value} but {name} has {env_value}; set "
                f"model.vla.{key}={env_value}"
            )
    if clones and not env.has_expert:
        raise EnvConfigError(no_expert_line(name))
    words = len(spec.instruction_vocab)
    if words > vocab_size - ACTION_BINS:
        raise EnvConfigError(
            f"{name}'s instructions use {words} words but model.vocab_size={vocab_size} "
            f"leaves {vocab_size - ACTION_BINS} ids before the {ACTION_BINS} action ids; set "
            f"model.vocab_size >= {words + ACTION_BINS}"
        )


def start_stages(
    config: MindRLConfig, layout: StageLayout, rank: int, device: Device
) -> SimulatorStages:
    """Actor rank ``rank``'s environments as ``env.pipeline_stages`` stages, stepped in
    this process (``env.placement: collocated``) or by an environment worker: beside it
    (``hybrid``) or in the rank's bundle of the run's environment-worker group
    (``disaggregated``); on ``device``'s accelerators under ``env.device: accelerator``."""
    env = config.env
    options = {
        "chunk_size": env.chunk_size,
        "horizon": env.horizon,
        "auto_reset": env.auto_reset,
        "seed": config.seed,
        "kwargs": env.kwargs,
    }
    if env.placement in ENV_WORKER_PLACEMENTS:
        place = env_worker_place(config, rank, device)
        return start_remote_stages(env.cls, layout, place=place, **options)
    on_device = str(device.device()) if env.device == "accelerator" else None
    return build_stages(env.cls, layout, device=on_device, **options)


def env_worker_place(config: MindRLConfig, rank: int, device: Device) -> EnvWorkerPlace:
    """Where actor rank ``rank``'s environment worker goes (``env.placement``,
    ``env.device``): a CPU slot on the rank's node; a share of the rank's device, in
    its bundle (actor rank ``r`` holds bundle ``r`` of the run's placement group,
    mindrl/workers/placement.py); or bundle ``rank`` of the environment-worker group,
    with a device of its own or not."""
    env = config.env
    if env.placement == ENV_DISAGGREGATED:
        return EnvWorkerPlace(bundle=rank, device=device if env.worker_devices else None)
    if env.worker_devices is None:
        return EnvWorkerPlace()
    share = bundle_share(resolve_layout(config).bundles()[rank])
    cpus = config.resources.cpus_per_worker
    return EnvWorkerPlace(rank, device, share, cpus, beside_rank=True)
