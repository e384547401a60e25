"""A Meta-World task on CPU MuJoCo as a :class:`~mindrl.envs.embodied.VectorEnv`.

Meta-World (``pip install 'mindrl[metaworld]'``: ``metaworld`` and the ``mujoco`` it
pins) is a set of Sawyer-arm manipulation tasks, each with a scripted expert
(``metaworld.policies``). ``MetaWorldVectorEnv`` runs ``num_envs`` copies of one task
(``push-v3`` by default: move a puck to a goal, which needs a reach, a descent onto the
puck and a push, unlike ``reach-v3``) in ``num_processes`` worker processes, each
stepping its share: MuJoCo's CPU simulator advances one environment per call, so the
batch is parallel across processes, not array operations (docs/environments.md,
"Meta-World").

Observations. ``states`` are the task's own 39 floats with the goal visible (hand
position, gripper opening, object poses, the previous frame's, the goal: what the
scripted experts read). ``images`` are zeros of the spec's shape: rendering needs an
offscreen OpenGL context (MuJoCo's EGL or OSMesa backend), which this project's CPU
machines lack, so the policy sees the state only. ``instructions`` name the task in a
few words of the environment's own vocabulary.

Episodes. Each atomic action gets the task's own shaped reward (0 to 10), or with
``reward="success"`` 1 for the action that succeeds and 0 for every other, the sparse
reward RLinf-VLA trains ManiSkill and LIBERO on. The shaped one pays each step near the
goal, so a policy earns more by succeeding later (and ending its episode later); the
sparse one pays success alone. An action after which ``info["success"]`` holds
terminates the episode; ``horizon`` actions truncate it. Actions are ``[-1, 1]^4``
(end-effector displacement, gripper effort).

Initial states. Meta-World draws a task's object and goal positions (its "rand_vec")
per reset from the environment's generator, redrawing until they suit the task (a puck
not already at its goal). Here the parent process picks that generator's seed for each
reset, a counter-based hash of (seed, the environment's global number or its reset
state id, the episode number on that stream), and the worker seeds the environment's
generator with it before resetting. MuJoCo's reset (``mj_resetData``) clears everything
else, so environments given one reset state id start identical, and a batch split over
any number of processes (or ``first_env_id`` sub-batches) gives the same episodes.

Processes. Workers are started with ``spawn`` (a fork of a process running threads, as
Ray's and torch's are, can deadlock), as daemons; ``close()`` stops them, and so does
garbage collection of the environment (a finaliser that holds no reference to it).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from mindrl.envs.embodied import (
    ActionSpec,
    ChunkResult,
    EnvConfigError,
    InitialStates,
    Observations,
    ObservationSpec,
    VectorEnv,
)

INSTALL_HINT = "pip install 'mindrl[metaworld]' (metaworld==3.1.1, mujoco==3.3.0)"

try:  # the guard: a run naming this class without the packages fails at load, in one line
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS
    from metaworld.policies import ENV_POLICY_MAP
except ImportError as exc:
    raise ImportError(
        f"mindrl.envs.metaworld_env needs Meta-World and MuJoCo ({exc.name} is missing): "
        f"{INSTALL_HINT}",
        name=exc.name,
    ) from None

#: What each task asks, in words; other tasks are named by their own name's words.
TASK_INSTRUCTIONS = {
    "push-v3": "push the puck to the goal",
    "reach-v3": "reach the goal",
    "button-press-v3": "press the button",
    "pick-place-v3": "pick the puck and place it at the goal",
}

#: What ``reward`` may name: the task's shaped reward, or 1 at success and 0 elsewhere.
REWARDS = ("shaped", "success")

#: Meta-World's own cap on an episode's length (SawyerXYZEnv.max_path_length).
MAX_HORIZON = 500

#: Seconds ``close()`` waits for a worker to exit before terminating it.
CLOSE_TIMEOUT_S = 10.0


def instruction_of(task: str) -> str:
    """The instruction an episode of ``task`` carries."""
    return TASK_INSTRUCTIONS.get(task, task.removesuffix("-v3").replace("-", " "))


class MetaWorldVectorEnv(VectorEnv):
    """``num_envs`` copies of one Meta-World task in worker processes (module docstring)."""

    def __init__(
        self,
        num_envs: int = 8,
        chunk_size: int = 4,
        horizon: int = 200,
        auto_reset: bool = True,
        seed: int = 0,
        first_env_id: int = 0,
        task: str = "push-v3",
        num_processes: int = 2,
        image_size: int = 64,
        reward: str = "shaped",
    ) -> None:
        super().__init__(num_envs, chunk_size, horizon, auto_reset, seed, first_env_id)
        if reward not in REWARDS:
            raise ValueError(f"MetaWorldVectorEnv: reward must be one of {REWARDS}, got {reward!r}")
        if task not in ALL_V3_ENVIRONMENTS:
            raise ValueError(
                f"MetaWorldVectorEnv: unknown task {task!r}; pick one of "
                f"{sorted(ALL_V3_ENVIRONMENTS)!r:.200}"
            )
        if num_processes < 1:
            raise ValueError(f"MetaWorldVectorEnv: num_processes must be >= 1, got {num_processes}")
        num_processes = min(num_processes, num_envs)  # a stage or a check may hold fewer
        if horizon > MAX_HORIZON:
            raise ValueError(
                f"MetaWorldVectorEnv: horizon {horizon} exceeds Meta-World's episode cap "
                f"of {MAX_HORIZON} actions"
            )
        self.task = task
        self.sparse_reward = reward == "success"
        self.instruction = instruction_of(task)
        self._expert: Callable[[np.ndarray], np.ndarray] | None = None  # built when asked
        self._shares = np.array_split(np.arange(num_envs), num_processes)
        self._workers = _start_workers(task, horizon, [len(s) for s in self._shares])
        self._finalizer = weakref.finalize(self, _stop_workers, self._workers)
        state_dim: int = self._workers[0].receive()
        for worker in self._workers[1:]:
            worker.receive()
        self.action_spec = ActionSpec(4, -np.ones(4), np.ones(4))
        self.observation_spec = ObservationSpec(
            image_size, image_size, state_dim, tuple(dict.fromkeys(self.instruction.split()))
        )
        self._instruction_ids = np.array(
            [self.observation_spec.instruction_vocab.index(w) for w in self.instruction.split()],
            dtype=np.int64,
        )
        self._states = np.zeros((num_envs, state_dim), dtype=np.float32)
        self._ended = np.zeros(num_envs, dtype=np.bool_)
        self._initial_states = InitialStates(num_envs, first_env_id, seed, type(self).__name__)
        self.reset()

    def reset(
        self, env_ids: np.ndarray | None = None, reset_state_ids: np.ndarray | None = None
    ) -> Observations:
        ids = self._initial_states.reset_ids(env_ids, reset_state_ids)
        self._start_episodes(ids)
        return self._observe(ids)

    def chunk_step(self, actions: np.ndarray) -> ChunkResult:
        actions = self.checked_actions(actions)
        for worker, share in zip(self._workers, self._shares, strict=True):
            worker.send(("step", actions[share]))
        rewards, terminations, truncations, valid = self.blank_chunk()
        for worker, share in zip(self._workers, self._shares, strict=True):
            part: _StepResult = worker.receive()
            self._states[share] = part.states
            rewards[share], valid[share] = part.rewards, part.valid
            terminations[share], truncations[share] = part.terminations, part.truncations
        success = terminations.any(axis=1)  # an episode terminates only on success
        if self.sparse_reward:
            rewards = terminations.astype(np.float32)
        self._ended |= (terminations | truncations).any(axis=1)
        return self.finish_chunk(rewards, terminations, truncations, valid, success)

    def expert_actions(self) -> np.ndarray:
        """The task's scripted expert's next action for every environment
        (:func:`scripted_expert` on the current states) as a chunk of one: the expert
        reacts to every state, so it has no chunk of several actions to give without
        simulating ahead.

        Raises:
            EnvConfigError: ``chunk_size`` is above 1.
        """
        if self.chunk_size != 1:
            raise EnvConfigError(
                f"MetaWorldVectorEnv's scripted expert acts on every observation: cloning "
                f"it needs env.chunk_size=1 (and model.vla.chunk_size=1), not {self.chunk_size}"
            )
        if self._expert is None:
            self._expert = scripted_expert(self.task)
        return self._expert(self._states)[:, None, :]

    def close(self) -> None:
        """Stop the worker processes (also done when the environment is collected)."""
        self._finalizer()

    @property
    def worker_pids(self) -> list[int]:
        """The worker processes' ids (for tests that check none outlives ``close``)."""
        return [worker.process.pid for worker in self._workers]

    def _start_episodes(self, ids: np.ndarray) -> None:
        """New episodes in ``ids``, each from the initial state its stream draws next."""
        if not ids.size:
            return
        draws = self._initial_states.draw(ids, 1)[:, 0]
        generator_seeds = (draws * 2.0**53).astype(np.int64)
        sent = []
        for worker, share in zip(self._workers, self._shares, strict=True):
            mine = np.isin(ids, share)
            if mine.any():
                worker.send(("reset", ids[mine] - share[0], generator_seeds[mine]))
                sent.append((worker, ids[mine]))
        for worker, reset_ids in sent:
            self._states[reset_ids] = worker.receive()
        self._ended[ids] = False

    def _observe(self, ids: np.ndarray) -> Observations:
        spec = self.observation_spec
        return Observations(
            images=np.zeros((ids.size, spec.image_height, spec.image_width, 3), dtype=np.uint8),
            states=self._states[ids].copy(),
            instructions=[self.instruction] * ids.size,
            instruction_ids=np.tile(self._instruction_ids, (ids.size, 1)),
        )


def scripted_expert(task: str) -> Callable[[np.ndarray], np.ndarray]:
    """Meta-World's scripted policy for ``task`` as a batch policy: states ``[n, 39]`` ->
    actions ``[n, 4]`` within ``[-1, 1]`` (the experts' gains overshoot the bounds; the
    environment clips them the same way)."""
    policy = ENV_POLICY_MAP[task]()

    def act(states: np.ndarray) -> np.ndarray:
        states = np.asarray(states, dtype=np.float64)
        with warnings.catch_warnings():  # "constant(s) may be too high": the clip's job
            warnings.simplefilter("ignore", UserWarning)
            actions = np.stack([policy.get_action(s) for s in states])
        return np.clip(actions, -1.0, 1.0).astype(np.float32)

    return act


# --- worker processes -------------------------------------------------------------------


@dataclass
class _StepResult:
    """One worker's share of a chunk step."""

    states: np.ndarray
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    valid: np.ndarray


@dataclass
class _Worker:
    process: mp.process.BaseProcess
    pipe: Connection

    def send(self, message: tuple) -> None:
        self.pipe.send(message)

    def receive(self) -> Any:
        """The worker's answer; its error, raised here, when it failed."""
        answer = self.pipe.recv()
        if isinstance(answer, _WorkerError):
            raise RuntimeError(f"Meta-World worker {self.process.pid} failed: {answer.message}")
        return answer


@dataclass
class _WorkerError:
    message: str


def _start_workers(task: str, horizon: int, counts: list[int]) -> list[_Worker]:
    context = mp.get_context("spawn")
    workers = []
    for count in counts:
        parent, child = context.Pipe()
        process = context.Process(
            target=_serve, args=(child, task, horizon, count), daemon=True, name="metaworld-env"
        )
        process.start()
        child.close()
        workers.append(_Worker(process, parent))
    return workers


def _stop_workers(workers: list[_Worker]) -> None:
    """Ask each worker to exit, then terminate the ones that did not in time."""
    for worker in workers:
        with contextlib.suppress(BrokenPipeError, OSError):  # a worker that already died
            worker.send(("close",))
    for worker in workers:
        worker.process.join(CLOSE_TIMEOUT_S)
        if worker.process.is_alive():
            worker.process.terminate()
            worker.process.join()
        worker.pipe.close()


def _serve(pipe: Connection, task: str, horizon: int, count: int) -> None:
    """A worker's loop: build ``count`` environments of ``task``, then answer commands."""
    try:
        envs = [_build_env(task, horizon) for _ in range(count)]
        pipe.send(envs[0].observation_space.shape[0])
        steps = np.zeros(count, dtype=np.int64)
        ended = np.zeros(count, dtype=np.bool_)
        states = np.zeros((count, envs[0].observation_space.shape[0]), dtype=np.float32)
        while True:
            command, *args = pipe.recv()
            if command == "close":
                return
            if command == "reset":
                local_ids, generator_seeds = args
                for i, generator_seed in zip(local_ids, generator_seeds, strict=True):
                    envs[i].np_random = np.random.Generator(np.random.PCG64(int(generator_seed)))
                    states[i] = envs[i].reset()[0]
                    steps[i], ended[i] = 0, False
                pipe.send(states[local_ids].copy())
            elif command == "step":
                pipe.send(_step_chunk(envs, args[0], steps, ended, states, horizon))
    except (EOFError, KeyboardInterrupt):
        return
    except Exception as exc:  # the parent raises it; a worker must not die silently
        pipe.send(_WorkerError(f"{type(exc).__name__}: {exc}"))


def _build_env(task: str, horizon: int) -> Any:
    """One environment of ``task`` with the goal in its observation, drawing its initial
    state from its own generator (``np_random``, which the parent seeds per reset), never
    from numpy's global one."""
    # The experts' gains trip Meta-World's "constant may be too high" warning every step.
    warnings.filterwarnings("ignore", module="metaworld")
    env = ALL_V3_ENVIRONMENTS[task]()
    env._partially_observable = False
    del env.sawyer_observation_space  # a cached property that depends on the above
    env._set_task_called = True
    env._freeze_rand_vec = False
    env.seeded_rand_vec = True
    env.max_path_length = max(horizon, MAX_HORIZON)
    return env


def _step_chunk(
    envs: list[Any],
    actions: np.ndarray,
    steps: np.ndarray,
    ended: np.ndarray,
    states: np.ndarray,
    horizon: int,
) -> _StepResult:
    """Apply each environment's C actions in turn, stopping it where its episode ends."""
    count, chunk = actions.shape[:2]
    result = _StepResult(
        states=states,
        rewards=np.zeros((count, chunk), dtype=np.float32),
        terminations=np.zeros((count, chunk), dtype=np.bool_),
        truncations=np.zeros((count, chunk), dtype=np.bool_),
        valid=np.zeros((count, chunk), dtype=np.bool_),
    )
    for i, env in enumerate(envs):
        for c in range(chunk):
            if ended[i]:
                break
            observation, reward, _, _, info = env.step(actions[i, c])
            steps[i] += 1
            states[i] = observation
            result.valid[i, c] = True
            result.rewards[i, c] = reward
            result.terminations[i, c] = bool(info["success"])
            result.truncations[i, c] = not info["success"] and steps[i] >= horizon
            ended[i] = result.terminations[i, c] or result.truncations[i, c]
    return result
