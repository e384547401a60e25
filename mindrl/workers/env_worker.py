"""Environment workers: Ray actors that hold the episodes' environment instances.

One worker holds many episodes, each its own instance of the run's ``env.cls`` built with
``env.kwargs`` (mindrl/envs/base.py). The worker is an asyncio actor: an ``async def``
method is awaited on its event loop and a plain one runs on a thread of its pool, so the
steps of different episodes run concurrently and a slow ``step`` holds up only its own
episode, unless the class limits how many of its steps one worker runs at once
(``max_concurrent_steps``): a step then waits for a free slot, and that wait is timed
apart from the step itself. Whatever an environment raises comes back as one line naming
the class and the episode's prompt (:class:`~mindrl.envs.EnvironmentFailed`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray

from mindrl.data.records import PromptRecord
from mindrl.envs import (
    EnvironmentFailed,
    call_env,
    checked_reset,
    checked_step,
    load_env_class,
    max_concurrent_steps,
    stop_strings,
    timed_call_env,
)

#: Threads for synchronous environments' methods: asyncio's default pool has cores + 4,
#: which would queue the steps of a rank's episodes behind one another on a small host;
#: an environment step mostly waits (a tool, a sandbox), so many threads cost little.
STEP_THREADS = 256
#: Calls one worker serves at once (Ray's async-actor concurrency).
MAX_CONCURRENT_CALLS = 1024


class EnvWorker:
    """Rank ``rank`` of ``size`` environment workers of the class ``cls_path``."""

    def __init__(self, rank: int, size: int, cls_path: str, kwargs: dict[str, Any]) -> None:
        self.rank, self.path, self.kwargs = rank, cls_path, dict(kwargs)
        self.cls = load_env_class(cls_path)  # fails here, at start-up, not mid-run
        self.stop_strings = stop_strings(self.cls, cls_path)
        limit = max_concurrent_steps(self.cls, cls_path)
        self._step_slots = asyncio.Semaphore(limit) if limit else None
        self.episodes: dict[int, tuple[Any, PromptRecord]] = {}
        self._pool_set = False

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def turn_stop_strings(self) -> tuple[str, ...]:
        """The texts that end a model turn (the class's ``stop_strings``)."""
        return self.stop_strings

    def _use_step_threads(self) -> None:
        if not self._pool_set:
            asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(STEP_THREADS))
            self._pool_set = True

    async def reset(self, key: int, record: PromptRecord) -> str:
        """A fresh instance for episode ``key``; the text its episode starts with."""
        self._use_step_threads()
        try:
            env = self.cls(**self.kwargs)
        except Exception as exc:
            raise self._failure("__init__", exc, record) from None
        self.episodes[key] = (env, record)
        try:
            return checked_reset(await call_env(env.reset, record), self.path)
        except EnvironmentFailed as exc:
            raise EnvironmentFailed(f"{exc} (episode prompt {_shown(record)})") from None
        except Exception as exc:
            raise self._failure("reset", exc, record) from None

    async def step(self, key: int, action: str) -> tuple[str, float, bool, float, float]:
        """Episode ``key``'s step on ``action``: observation, reward, done, the seconds
        inside the environment's ``step``, and the seconds it waited before it (for a step
        slot when the class limits them, and for a thread)."""
        env, record = self.episodes[key]
        arrived = time.perf_counter()
        async with self._step_slots or contextlib.nullcontext():
            try:
                result, inside = await timed_call_env(env.step, action)
                result = checked_step(result, self.path)
            except EnvironmentFailed as exc:
                raise EnvironmentFailed(f"{exc} (episode prompt {_shown(record)})") from None
            except Exception as exc:
                raise self._failure("step", exc, record) from None
        return (*result, inside, max(time.perf_counter() - arrived - inside, 0.0))

    async def close(self, keys: list[int]) -> None:
        """Drop finished episodes' instances (an instance never outlives its episode)."""
        for key in keys:
            self.episodes.pop(key, None)

    def _failure(self, method: str, exc: Exception, record: PromptRecord) -> EnvironmentFailed:
        error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        return EnvironmentFailed(
            f"environment {self.path} raised in {method} ({error}) on the episode whose "
            f"prompt is {_shown(record)}"
        )


def _shown(record: PromptRecord) -> str:
    """The prompt as an error line shows it: quoted, one line, at most 80 characters."""
    text = record.text.replace("\n", " ")
    return repr(text if len(text) <= 80 else text[:77] + "...")


def env_worker_class() -> Any:
    """The Ray actor class of :class:`EnvWorker` (async: its calls run concurrently)."""
    return ray.remote(max_concurrency=MAX_CONCURRENT_CALLS)(EnvWorker)
