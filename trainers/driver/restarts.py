"""Automatic restart (``resilience.max_restarts``): a run whose worker died, whose stage or
collective timed out, or whose stage failed with an error that is not the user's, is torn
down (workers, dock) and started again from its latest complete checkpoint, with the
samples that checkpoint kept in flight, up to N times per run.

Not restarted, because the same run would fail the same way: a worker killed for memory
(the fix is a setting, which its line names) and a worker's ``ValueError`` (this
project's user mistakes, a bad config, file or checkpoint, are ``ValueError``\\ s).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from backends.megatron import checkpoint
from mindrl.dock import DockError
from mindrl.workers.group import (
    StageFailedError,
    StageTimeoutError,
    WorkerDiedError,
    WorkerOutOfMemoryError,
    first_line,
)

#: Failures of the run itself (exit 1), as opposed to user mistakes (exit 2).
RUN_FAILURES = (WorkerDiedError, StageTimeoutError, StageFailedError, DockError)


def restartable(exc: BaseException) -> bool:
    """Whether starting the workers again may get past ``exc``."""
    if isinstance(exc, WorkerOutOfMemoryError):
        return False
    if isinstance(exc, StageFailedError) and exc.user_error:
        return False
    return isinstance(exc, RUN_FAILURES)


class Restarts:
    """The run's restarts so far, and the notes the next metrics record carries."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.done = 0
        self._notes: list[dict[str, Any]] = []

    def allow(self, exc: BaseException) -> bool:
        return self.done < self.limit and restartable(exc)

    def begin(self, exc: BaseException, checkpoint_dir: Path, resume: bool | str) -> bool | str:
        """Count a restart after ``exc`` and say so in one line; returns what the new start
        resumes from: the run's latest complete checkpoint, else the run's own ``resume``
        (a fresh start when it had none)."""
        self.done += 1
        latest = checkpoint.latest_dir(Path(checkpoint_dir) / "actor")
        what = first_line(exc)
        if latest is not None:
            where, resume = f"resuming from {latest.name}", True
        elif resume:
            where = "resuming from the checkpoint it started from"
        else:
            where = "starting afresh (no checkpoint yet)"
        print(
            f"mindrl-train: restart {self.done}/{self.limit} after {what}, {where}",
            file=sys.stderr,
            flush=True,
        )
        self._notes.append(
            {
                "restart": self.done,
                "max_restarts": self.limit,
                "after": what,
                "resumed_from": latest.name if latest is not None else None,
            }
        )
        return resume

    def take_notes(self) -> list[dict[str, Any]]:
        """The restarts since the last record (for the next one's ``restarts`` key)."""
        notes, self._notes = self._notes, []
        return notes
