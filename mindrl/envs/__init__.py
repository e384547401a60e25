"""Environments of multi-turn runs: the interface (:mod:`mindrl.envs.base`) and the loader.

A run names its environment in the config's ``env`` section
(``env: {cls: "package.module:ClassName", kwargs: {...}, max_turns: N, max_turn_tokens: M,
workers: W}``); without ``env.cls`` a run is single-turn (docs/architecture.md §12).
Embodied environments (``env.kind: embodied``: N simulators stepped in chunks of actions)
have their own interface, :mod:`mindrl.envs.embodied`, imported from that module.
"""

from mindrl.envs.base import (
    EnvConfigError,
    Environment,
    EnvironmentFailed,
    StepResult,
    call_env,
    checked_reset,
    checked_step,
    load_env_class,
    make_env,
    max_concurrent_steps,
    split_class_path,
    stop_strings,
    timed_call_env,
)

__all__ = [
    "EnvConfigError",
    "Environment",
    "EnvironmentFailed",
    "StepResult",
    "call_env",
    "checked_reset",
    "checked_step",
    "load_env_class",
    "make_env",
    "max_concurrent_steps",
    "split_class_path",
    "stop_strings",
    "timed_call_env",
]
