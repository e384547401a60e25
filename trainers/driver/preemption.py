"""SIGTERM, a scheduler's notice that the job is about to be killed: the run finishes the
iteration it is in, saves a checkpoint and exits 0 with the command that resumes it, all
within ``resilience.preempt_timeout_s``.

The notice only sets a flag (the loop checks it after each iteration) and arms a timer
(SIGALRM) for the iteration's share of the bound: the bound less a reserve for the save,
the larger of twice the last save's time and a fifth of the bound. An iteration still
running when the timer fires is abandoned (:class:`Preempted` is raised in the driver's
main thread, which is then waiting on the workers): its workers are half-way through a
stage, so no consistent checkpoint of it exists, and the last complete checkpoint stands.
Signals reach only the main thread, hence a timer signal rather than a watchdog thread.
"""

from __future__ import annotations

import shlex
import signal
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType

#: The save's reserve is at least this share of the bound.
SAVE_RESERVE_SHARE = 0.2


class Preempted(Exception):
    """SIGTERM arrived: the iteration in progress (if any) is finished or abandoned."""


class PreemptionNotice:
    """Catches SIGTERM for the duration of a run (a ``with`` block, main thread only)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.received_at: float | None = None
        self.last_save_s = 0.0
        self._previous: dict[int, object] = {}

    @property
    def received(self) -> bool:
        return self.received_at is not None

    def remaining_s(self) -> float:
        """Seconds left of the bound since the notice (the whole bound before one)."""
        if self.received_at is None:
            return self.timeout_s
        return self.timeout_s - (time.monotonic() - self.received_at)

    def iteration_budget_s(self) -> float:
        """What the iteration in progress may still take: the bound less the save's reserve."""
        reserve = max(2 * self.last_save_s, SAVE_RESERVE_SHARE * self.timeout_s)
        return self.remaining_s() - reserve

    def disarm(self) -> None:
        """The iteration finished in time: the save that follows must not be interrupted."""
        if self._previous:
            signal.setitimer(signal.ITIMER_REAL, 0)

    def __enter__(self) -> PreemptionNotice:
        if threading.current_thread() is threading.main_thread():
            handlers = {signal.SIGTERM: self._on_term, signal.SIGALRM: self._on_alarm}
            for signum, handler in handlers.items():
                self._previous[signum] = signal.signal(signum, handler)
        return self

    def listen(self) -> None:
        """Take SIGTERM back: ``ray.init`` makes a driver's SIGTERM exit at once."""
        if self._previous:
            signal.signal(signal.SIGTERM, self._on_term)

    def __exit__(self, *exc_info: object) -> None:
        self.disarm()
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        if self.received:
            return  # a repeated notice changes nothing
        self.received_at = time.monotonic()
        budget = self.iteration_budget_s()
        print(
            f"mindrl-train: SIGTERM: finishing this iteration (up to {max(budget, 0):.0f} s), "
            f"then saving a checkpoint; exit within {self.timeout_s:.0f} s "
            "(resilience.preempt_timeout_s)",
            file=sys.stderr,
            flush=True,
        )
        if budget <= 0:
            raise Preempted
        signal.setitimer(signal.ITIMER_REAL, budget)

    def _on_alarm(self, signum: int, frame: FrameType | None) -> None:
        raise Preempted


def resume_command(argv: Sequence[str]) -> str:
    """The ``mindrl-train`` command line of ``argv`` continuing from the run's latest
    checkpoint: its own ``--resume`` / ``--resume-from`` replaced by ``--resume``."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--resume-from":
            skip = True
        elif arg != "--resume" and not arg.startswith("--resume-from="):
            kept.append(arg)
    return shlex.join(["mindrl-train", *kept, "--resume"])
