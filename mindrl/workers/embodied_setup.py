"""What an embodied actor rank builds its environments with and checks them against:
its stages, in place or in an environment worker (``env.placement``), and whether the
policy reads and writes what they observe and take."""

from __future__ import annotations

from backends.megatron.families.vla import ACTION_BINS, VLASpec
from mindrl.config.schema import ENV_DISAGGREGATED, ENV_WORKER_PLACEMENTS, MindRLConfig
from mindrl.envs.embodied import EnvConfigError, no_expert_line
from mindrl.envs.stages import EnvDescription, SimulatorStages, StageLayout, build_stages
from mindrl.workers.vector_env_worker import start_remote_stages


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


def start_stages(config: MindRLConfig, layout: StageLayout, rank: int) -> SimulatorStages:
    """Actor rank ``rank``'s environments as ``env.pipeline_stages`` stages, stepped in
    this process (``env.placement: collocated``) or by an environment worker: beside it
    (``hybrid``) or in the rank's bundle of the run's environment-worker group
    (``disaggregated``)."""
    env = config.env
    options = {
        "chunk_size": env.chunk_size,
        "horizon": env.horizon,
        "auto_reset": env.auto_reset,
        "seed": config.seed,
        "kwargs": env.kwargs,
    }
    if env.placement in ENV_WORKER_PLACEMENTS:
        bundle = rank if env.placement == ENV_DISAGGREGATED else None
        return start_remote_stages(env.cls, layout, bundle=bundle, **options)
    return build_stages(env.cls, layout, **options)
