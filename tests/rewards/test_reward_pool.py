"""The reward pool: every call ends as an outcome, and nothing a call starts outlives it."""

from __future__ import annotations

import math
import textwrap

import psutil
import pytest

from mindrl.rewards.functions import FunctionSpec
from mindrl.rewards.inputs import ABSTAIN, ERROR, INVALID, OK, TIMEOUT, RewardInput
from mindrl.rewards.pool import Job, RewardPool

USER_MODULE = '''
    import asyncio
    import ctypes
    import os
    import signal
    import subprocess
    import time

    def exact(inp, scale=1.0):
        return scale * float(inp.response == inp.answer)

    def answers(inp, answer=None):
        return answer

    def timed(inp, seconds=0.4):
        start = time.time()
        time.sleep(seconds)
        return {"score": 1.0, "start": start, "end": time.time(), "pid": os.getpid()}

    def lengths(inputs, extra=0):
        return [len(inp.response) for inp in inputs] + [0.0] * extra

    def fails(inp):
        raise ValueError("no verdict for this one\\nsecond line")

    def dies(inp, how):
        if how == "abort":
            os.abort()
        if how == "segfault":
            ctypes.string_at(0)
        if how == "exit":
            os._exit(3)
        os.kill(os.getpid(), signal.SIGKILL)

    def double_forked_daemon():
        """A daemon the classic way: fork, setsid, fork again, the middle one exits; the
        daemon is nobody's child any more (an orphan)."""
        read, write = os.pipe()
        middle = os.fork()
        if middle == 0:
            os.setsid()
            daemon = os.fork()
            if daemon == 0:
                os.execvp("sleep", ["sleep", "60"])
            os.write(write, str(daemon).encode())
            os._exit(0)
        os.waitpid(middle, 0)
        daemon = int(os.read(read, 32))
        os.close(read)
        os.close(write)
        return daemon

    def starts_processes(pid_file):
        """A child, a child in a session of its own and a double-forked daemon."""
        child = subprocess.Popen(["sleep", "60"])
        own_session = subprocess.Popen(["sleep", "60"], start_new_session=True)
        pids = [child.pid, own_session.pid, double_forked_daemon()]
        with open(pid_file, "w") as out:
            out.write(" ".join(map(str, pids)))

    def hangs(inp, pid_file=None, seconds=60):
        if pid_file is not None:
            starts_processes(pid_file)
        time.sleep(seconds)

    def leaves_a_daemon(inp, pid_file):
        starts_processes(pid_file)
        return 1.0

    def aborts_with_a_child(inp, pid_file):
        child = subprocess.Popen(["sleep", "60"])
        with open(pid_file, "w") as out:
            out.write(str(child.pid))
        os.abort()

    def kills_the_server(inp):
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(60)

    async def judged(inp, seconds=0.0, fail=None):
        start = time.time()
        await asyncio.sleep(seconds)
        if fail == "timeout":
            raise asyncio.TimeoutError()
        if fail:
            raise RuntimeError(fail)
        return {"score": 0.5, "start": start, "end": time.time()}
'''


@pytest.fixture(scope="module")
def user_path(tmp_path_factory):
    """The user's reward module on sys.path (as from PYTHONPATH) before any pool starts."""
    path = tmp_path_factory.mktemp("user")
    (path / "pool_rewards.py").write_text(textwrap.dedent(USER_MODULE))
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(path))
        yield path


@pytest.fixture(scope="module")
def pool(user_path):
    with RewardPool(processes=2, preload=["pool_rewards:exact"]) as pool:
        yield pool


def fn(name: str, timeout_s: float = 10.0, group: bool = False, **kwargs) -> FunctionSpec:
    """A spec of ``pool_rewards:<name>``, named after it."""
    return FunctionSpec(name, f"pool_rewards:{name}", kwargs, timeout_s, group)


def sample(response: str = "42", answer: str = "42", uid: str = "q#0") -> RewardInput:
    return RewardInput(uid=uid, prompt="6 x 7 =", response=response, answer=answer)


def descendants() -> set[int]:
    """The pids of every process below this one (zombies included)."""
    return {child.pid for child in psutil.Process().children(recursive=True)}


def alive(pids) -> list[int]:
    """Those of ``pids`` still in the process table (a zombie counts: it is not reaped)."""
    return [pid for pid in pids if psutil.pid_exists(pid)]


def pids_in(path) -> list[int]:
    return [int(pid) for pid in path.read_text().split()]


def overlap(first: dict, second: dict) -> bool:
    return first["start"] < second["end"] and second["start"] < first["end"]


def test_a_score_a_dict_with_components_and_none_become_ok_ok_and_abstain(pool):
    right, wrong = pool.score(fn("exact", scale=2.0), [sample("42"), sample("41")])
    assert (right.status, right.score, wrong.status, wrong.score) == (OK, 2.0, OK, 0.0)
    [abstained] = pool.score(fn("answers", answer=None), sample())
    assert (abstained.status, abstained.score, abstained.error) == (ABSTAIN, None, "")
    [parts] = pool.score(fn("answers", answer={"score": 0.7, "format": 1, "length": 0.5}), sample())
    assert (parts.status, parts.score) == (OK, 0.7)
    assert parts.components == {"format": 1.0, "length": 0.5}


def test_a_nan_or_a_string_is_invalid_naming_the_function(pool):
    [nan] = pool.score(fn("answers", answer=math.nan), sample())
    [text] = pool.score(fn("answers", answer="0.9"), sample())
    assert (nan.status, nan.error) == (INVALID, "answers returned a score of nan")
    assert (text.status, text.error) == (INVALID, "answers returned str '0.9' instead of a number")


def test_an_exception_is_an_error_with_its_type_and_first_line(pool):
    [failed] = pool.score(fn("fails"), sample())
    assert (failed.status, failed.score) == (ERROR, None)
    assert failed.error == "fails raised ValueError: no verdict for this one"


def test_a_group_function_gets_the_group_in_one_call_and_a_wrong_length_is_invalid_for_all(pool):
    group = [sample("1"), sample("333"), sample("55")]
    assert [o.score for o in pool.score(fn("lengths", group=True), group)] == [1.0, 3.0, 2.0]
    wrong = pool.score(fn("lengths", group=True, extra=1), group)
    assert [o.status for o in wrong] == [INVALID] * 3
    assert {o.error for o in wrong} == {"lengths returned a list of 4 for a group of 3"}


def test_outcomes_come_back_per_job_in_order_one_per_input(pool):
    jobs = [
        Job(fn("exact"), [sample("42"), sample("7"), sample("42")]),
        Job(fn("lengths", group=True), [sample("1"), sample("22")]),
        Job(fn("answers", answer=0.25), sample()),
        Job(fn("exact"), []),
    ]
    results = pool.run(jobs)
    assert [[o.score for o in outcomes] for outcomes in results] == [
        [1.0, 0.0, 1.0],
        [1.0, 2.0],
        [0.25],
        [],
    ]


def test_a_timeout_kills_the_call_and_everything_it_started_and_the_pool_goes_on(pool, tmp_path):
    pid_file = tmp_path / "pids"
    before = set(pool.pids())
    [late] = pool.score(fn("hangs", timeout_s=1.0, pid_file=str(pid_file)), sample())
    assert (late.status, late.error) == (TIMEOUT, "hangs took longer than 1 s")
    assert late.latency_s >= 1.0
    started = pids_in(pid_file)
    assert len(started) == 3  # a child, a child in its own session, a double-forked daemon
    assert alive(started) == []
    assert len(set(pool.pids()) - before) == 1  # the killed process was replaced
    [scored] = pool.score(fn("exact"), sample())
    assert (scored.status, scored.score) == (OK, 1.0)


@pytest.mark.parametrize(
    ("how", "ending"),
    [
        ("abort", "signal SIGABRT"),
        ("segfault", "signal SIGSEGV"),
        ("exit", "exit code 3"),
        ("signal", "signal SIGKILL"),
    ],
)
def test_a_process_that_dies_mid_call_is_an_error_naming_how_and_is_replaced(pool, how, ending):
    [died] = pool.score(fn("dies", how=how), sample())
    assert (died.status, died.error) == (ERROR, f"dies: the reward process died: {ending}")
    assert [o.score for o in pool.score(fn("exact"), [sample(), sample()])] == [1.0, 1.0]
    assert len(pool.pids()) == 3  # the server and two pool processes


def test_what_a_process_that_died_left_running_is_killed(pool, tmp_path):
    pid_file = tmp_path / "pid"
    [died] = pool.score(fn("aborts_with_a_child", pid_file=str(pid_file)), sample())
    assert died.error == "aborts_with_a_child: the reward process died: signal SIGABRT"
    assert alive(pids_in(pid_file)) == []


def test_an_input_that_does_not_pickle_is_an_error_before_any_process_runs(pool):
    unpicklable = RewardInput("q#0", "p", "42", "42", meta={"check": lambda: 0})
    [unsent], [scored] = pool.run([Job(fn("exact"), unpicklable), Job(fn("exact"), sample())])
    assert (unsent.status, unsent.error) == (
        ERROR,
        "exact: its input cannot reach a reward process: AttributeError: Can't pickle local "
        "object 'test_an_input_that_does_not_pickle_is_an_error_before_any_process_runs."
        "<locals>.<lambda>'",
    )
    assert (scored.status, scored.score) == (OK, 1.0)


def test_a_function_that_kills_the_process_server_ends_its_calls_not_the_pool(pool):
    server = pool.pids()[0]
    killer, bystander = pool.run(
        [Job(fn("kills_the_server"), sample()), Job(fn("timed"), sample())]
    )
    died = "the reward process died: its process server died"
    assert [o.error for o in killer] == [f"kills_the_server: {died}"]
    # A call already running in a live pool process may still answer before the pool
    # notices the server is gone; either way it ends with a status, not a hang.
    assert [(o.status, o.error) for o in bystander] in ([(OK, "")], [(ERROR, f"timed: {died}")])
    assert not psutil.pid_exists(server)
    assert pool.pids()[0] != server  # a new server, with new processes
    assert [o.score for o in pool.score(fn("exact"), [sample(), sample()])] == [1.0, 1.0]


def test_a_hundred_concurrent_timeouts_leave_no_process_over(pool, tmp_path):
    others = descendants() - set(pool.pids())
    pid_files = [tmp_path / f"pids{i}" for i in range(100)]
    jobs = [Job(fn("hangs", timeout_s=0.05, pid_file=str(p)), sample()) for p in pid_files]
    outcomes = [outcome for result in pool.run(jobs) for outcome in result]
    assert [o.status for o in outcomes] == [TIMEOUT] * 100
    started = [pid for path in pid_files if path.exists() for pid in pids_in(path)]
    assert alive(started) == []
    assert descendants() == others | set(pool.pids())
    assert len(pool.pids()) == 3


def test_synchronous_calls_run_at_once_in_different_processes(pool):
    first, second = (o.components for o in pool.score(fn("timed"), [sample(), sample()]))
    assert overlap(first, second)
    assert first["pid"] != second["pid"]


def test_an_async_function_runs_on_the_loop_beside_the_processes(pool):
    jobs = [
        Job(fn("judged", seconds=0.4), [sample(), sample(), sample()]),
        Job(fn("timed", seconds=0.4), sample()),
    ]
    judged, [timed] = pool.run(jobs)
    assert [(o.status, o.score) for o in judged] == [(OK, 0.5)] * 3
    assert overlap(judged[0].components, judged[2].components)
    assert overlap(judged[1].components, timed.components)


def test_an_async_function_times_out_and_its_own_errors_are_errors(pool):
    [late] = pool.score(fn("judged", timeout_s=0.2, seconds=30), sample())
    assert (late.status, late.error) == (TIMEOUT, "judged took longer than 0.2 s")
    [failed] = pool.score(fn("judged", fail="rate limited"), sample())
    assert (failed.status, failed.error) == (ERROR, "judged raised RuntimeError: rate limited")
    [own_timeout] = pool.score(fn("judged", fail="timeout"), sample())
    assert (own_timeout.status, own_timeout.error) == (ERROR, "judged raised TimeoutError")


def test_close_ends_every_process_and_what_their_calls_left_running(user_path, tmp_path):
    before = descendants()
    pid_file = tmp_path / "pids"
    with RewardPool(processes=1) as pool:
        [scored] = pool.score(fn("leaves_a_daemon", pid_file=str(pid_file)), sample())
        assert scored.score == 1.0
        left = pids_in(pid_file)
        assert alive(left) == left  # a finished call's daemons live until the pool closes
        assert len(descendants() - before) == 2 + 3
    assert alive(left) == []
    assert descendants() == before
