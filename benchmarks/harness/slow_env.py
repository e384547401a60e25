"""The recall environment with a step that takes time, three ways (benchmarks/env.py):

* :class:`AsyncSlowRecallEnv`: ``async def step`` that awaits ``delay_s`` (a tool that
  waits on I/O: a sandbox, an HTTP call). Its waits overlap on the worker's event loop.
* :class:`ThreadSlowRecallEnv`: a plain ``step`` that sleeps ``delay_s`` (a blocking
  tool); the environment worker runs it on a thread, so its waits overlap as far as the
  worker's threads go.
* :class:`SerialSlowRecallEnv`: the same sleep, declared ``max_concurrent_steps = 1``,
  so each environment worker runs one of its steps at a time and with ``env.workers: 1``
  episodes step one at a time: the baseline that concurrent stepping is measured
  against. The worker times a step's wait for its turn apart from the step.

Named in a config as ``benchmarks.harness.slow_env:AsyncSlowRecallEnv`` with the
repository root on ``PYTHONPATH``; ``delay_s`` comes from ``env.kwargs``.
"""

from __future__ import annotations

import asyncio
import time
from typing import ClassVar

from mindrl.envs.recall import RecallEnv


class AsyncSlowRecallEnv(RecallEnv):
    """:class:`RecallEnv` whose ``step`` awaits ``delay_s`` seconds first."""

    def __init__(self, delay_s: float = 0.0, length: int = 1, seed: int | None = None) -> None:
        super().__init__(length=length, seed=seed)
        self.delay_s = delay_s

    async def step(self, action: str) -> tuple[str, float, bool]:  # type: ignore[override]
        await asyncio.sleep(self.delay_s)
        return super().step(action)


class ThreadSlowRecallEnv(RecallEnv):
    """:class:`RecallEnv` whose ``step`` blocks ``delay_s`` seconds first."""

    def __init__(self, delay_s: float = 0.0, length: int = 1, seed: int | None = None) -> None:
        super().__init__(length=length, seed=seed)
        self.delay_s = delay_s

    def step(self, action: str) -> tuple[str, float, bool]:
        time.sleep(self.delay_s)
        return super().step(action)


class SerialSlowRecallEnv(ThreadSlowRecallEnv):
    """:class:`ThreadSlowRecallEnv` stepping one episode at a time per environment worker."""

    max_concurrent_steps: ClassVar[int] = 1
