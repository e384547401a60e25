"""The preemption notice on its own, with real signals to this process (no Ray): an
iteration that ends within its share of ``resilience.preempt_timeout_s`` leaves a flag,
one that does not is abandoned once that share is spent."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from trainers.driver.preemption import Preempted, PreemptionNotice

pytestmark = pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(),
    reason="signal handlers belong to the main thread",
)


def test_an_iteration_that_ends_in_time_is_finished_and_the_save_is_not_interrupted(capsys):
    with PreemptionNotice(timeout_s=2.0) as notice:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)  # the rest of the iteration
        assert notice.received
        notice.disarm()  # what the loop does before it saves
        time.sleep(1.8)  # a save longer than the iteration's share: no alarm
    assert "SIGTERM: finishing this iteration (up to 2 s)" in capsys.readouterr().err


def test_an_iteration_past_its_share_of_the_bound_is_abandoned_in_time():
    notice = PreemptionNotice(timeout_s=1.0)
    notice.last_save_s = 0.25  # reserve max(2 x 0.25, 1.0 / 5) = 0.5 s for the save
    started = time.monotonic()
    with pytest.raises(Preempted), notice:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # an iteration that would not end in time
    assert 0.4 < time.monotonic() - started < 0.9
    assert notice.remaining_s() > 0.1  # what is left is the save's


def test_the_handlers_before_the_run_are_back_after_it():
    before = signal.getsignal(signal.SIGTERM)
    with PreemptionNotice(timeout_s=1.0):
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before
