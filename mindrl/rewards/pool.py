"""Reward calls that never serialise the step and that no failing function can end.

A reward worker hands :meth:`RewardPool.run` a batch of :class:`Job` s and gets one
:class:`~mindrl.rewards.inputs.RewardOutcome` per input back, in order. Every call of the
batch runs at once: a synchronous function in one of ``processes`` pool processes, an
``async def`` function on the pool's event loop in the worker itself. A call can only end
as an outcome: past its ``timeout_s`` it is ``timeout`` and its process is killed with
everything it started; a process that dies (abort, segfault, ``os._exit``, a signal) makes
its call ``error`` naming how it died; an exception is ``error`` with its first line; an
answer that is not a score is ``invalid``. A killed or dead process is replaced in a few
tens of milliseconds, so the pool goes on scoring.

How the processes are made, and why not the standard pools:

* ``concurrent.futures`` / ``multiprocessing.Pool`` cannot kill one hung call: a timeout
  leaves the process running (or breaks the whole executor), and nothing there kills
  what the call started. So the pool processes are our own, one call at a time each.
* A reward worker is a Ray actor with threads, where ``fork`` is unsafe, and a fresh
  interpreter costs seconds (a user's module may import torch, sympy or an HTTP client).
  So one *process server* is started with ``subprocess`` (a fresh interpreter: safe
  beside threads), imports the pool, the functions' modules once, and forks every pool
  process from its single thread: a replacement is ready in about
  20 ms with every module already imported. ``multiprocessing``'s forkserver does the same
  but is one per interpreter, keeps the preloads of its first start and outlives every
  pool; ours is this pool's, and :meth:`RewardPool.close` leaves no process behind.
* Each pool process starts its own session (``setsid``) and is a *child subreaper*
  (Linux): whatever its call starts stays below it in the process tree, even a
  double-forked daemon or a process that called ``setsid``. A timeout stops that tree
  (SIGSTOP, until it no longer grows), kills it and the session's process group, and
  reaps it. The server is a subreaper too, so what a process that died left running
  comes to the server and is killed. Processes are found with psutil, which checks a pid
  was not reused before it signals; nothing outside the pool is ever signalled.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib
import json
import os
import pickle
import resource
import select
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import psutil

from mindrl.rewards.functions import (
    FunctionSpec,
    LoadedFunction,
    RewardFunctionError,
    first_line,
    import_target,
    load_function,
)
from mindrl.rewards.inputs import (
    ERROR,
    INVALID,
    TIMEOUT,
    InvalidAnswer,
    RewardInput,
    RewardOutcome,
    outcome_of,
)

DEFAULT_PROCESSES = 2
#: The process server imports torch (through ``mindrl.rewards``): seconds on a cold disk.
SERVER_START_S = 180.0
#: How long the pool waits for the server to fork, or to kill and reap a process tree.
SERVER_REPLY_S = 30.0
#: How long the server waits for a killed tree's processes to be reaped.
REAP_S = 5.0
#: Grace a cancelled ``async`` call gets to unwind before the pool moves on.
CANCEL_GRACE_S = 1.0

# Linux prctl options (linux/prctl.h).
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class Job:
    """One function's calls for some inputs; its outcomes are one per input, in order.

    A function with ``group: false`` is called once per input (the calls run at once);
    a ``group: true`` function once with the list of inputs (a prompt's N responses).

    Attributes:
        function: what to call (a spec is loaded, and checked, on first use).
        inputs: one input, or a list of them.
    """

    function: LoadedFunction | FunctionSpec
    inputs: RewardInput | Sequence[RewardInput]

    def input_list(self) -> list[RewardInput]:
        return [self.inputs] if isinstance(self.inputs, RewardInput) else list(self.inputs)


class RewardPool:
    """Runs reward calls concurrently: synchronous ones in ``processes`` pool processes,
    ``async`` ones on an event loop of the calling process. Synchronous API (a reward
    worker's methods are synchronous); one :meth:`run` at a time.

    Args:
        processes: pool processes (synchronous calls that run at once).
        preload: ``module:function`` targets (or module names) the pool processes import
            before they start, so no call pays for the import; the targets of the
            synchronous jobs :meth:`run` sees are preloaded for later processes anyway.
    """

    def __init__(self, processes: int = DEFAULT_PROCESSES, preload: Sequence[str] = ()) -> None:
        if processes < 1:
            raise ValueError(f"a reward pool needs at least one process, got {processes}")
        self.processes = processes
        self._loop = asyncio.new_event_loop()
        self._preload = {target.partition(":")[0] for target in preload}
        self._loaded: dict[str, LoadedFunction] = {}
        self._server: _Server | None = None
        self._workers: dict[int, _Worker] = {}
        self._idle: asyncio.Queue[_Worker] = asyncio.Queue()
        self._closed = False
        try:
            self._loop.run_until_complete(self._start())
        except BaseException:
            self.close()
            raise

    def run(self, jobs: Sequence[Job]) -> list[list[RewardOutcome]]:
        """Every call of ``jobs`` at once; ``result[j][k]`` is the outcome of ``jobs[j]``'s
        k-th input (a single-input job's list has one). A call never raises: whatever the
        function does ends as an outcome.

        Raises:
            RewardFunctionError: a job's :class:`FunctionSpec` does not load.
            RuntimeError: the pool is closed, or its process server cannot start.
        """
        if self._closed:
            raise RuntimeError("the reward pool is closed")
        return self._loop.run_until_complete(self._run(jobs))

    def score(
        self, function: LoadedFunction | FunctionSpec, inputs: RewardInput | Sequence[RewardInput]
    ) -> list[RewardOutcome]:
        """The outcomes of one job: ``run([Job(function, inputs)])[0]``."""
        return self.run([Job(function, inputs)])[0]

    def pids(self) -> list[int]:
        """The process server's pid, then the pool processes' (what :meth:`close` ends)."""
        if self._server is None:
            return []
        return [self._server.process.pid, *sorted(self._workers)]

    def close(self) -> None:
        """End every pool process, what they started and the process server."""
        if self._closed:
            return
        self._closed = True
        for worker in self._workers.values():
            worker.conn.close()
        self._workers.clear()
        if self._server is not None:
            self._server.close()
        # An async call that ignored its cancellation may still be pending: end it here
        # rather than leave asyncio to warn about a destroyed task.
        left = asyncio.all_tasks(self._loop)
        for task in left:
            task.cancel()
        if left:
            self._loop.run_until_complete(asyncio.wait(left, timeout=CANCEL_GRACE_S))
        self._loop.close()

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # The event loop's side: each call one coroutine, all of a run gathered.

    async def _start(self) -> None:
        """Fill every slot: at start, and before each run in case a replacement failed
        (then that run raised), so a lost slot never leaves a call waiting forever."""
        while len(self._workers) < self.processes:
            self._idle.put_nowait(await self._spawn())

    async def _run(self, jobs: Sequence[Job]) -> list[list[RewardOutcome]]:
        functions = [self._load(job.function) for job in jobs]  # a bad spec: before any call
        await self._start()
        calls, calls_per_job = [], []
        for loaded, job in zip(functions, jobs, strict=True):
            inputs = job.input_list()
            # A group function: one call with the list; any other: one call per input.
            payloads: list[Any] = [inputs] if loaded.group and inputs else inputs
            calls_per_job.append(len(payloads))
            calls += [asyncio.ensure_future(self._call(loaded, payload)) for payload in payloads]
        try:
            answers = iter(await asyncio.gather(*calls))
        except BaseException:  # the server cannot start, or Ctrl-C: no call outlives run()
            for call in calls:
                call.cancel()
            await asyncio.wait(calls)
            raise
        results = []
        for count in calls_per_job:
            results.append([outcome for _ in range(count) for outcome in next(answers)])
        return results

    def _load(self, function: LoadedFunction | FunctionSpec) -> LoadedFunction:
        if isinstance(function, FunctionSpec):
            key = repr(function)
            if key not in self._loaded:
                self._loaded[key] = load_function(function)
            function = self._loaded[key]
        module = function.spec.target.partition(":")[0]
        if not function.is_async and module not in self._preload:
            self._preload.add(module)  # later pool processes are forked with it imported
            if self._server is not None:
                self._server.preload([module])
        return function

    async def _call(self, loaded: LoadedFunction, payload: Any) -> list[RewardOutcome]:
        size = len(payload) if loaded.group else None
        if loaded.is_async:
            return await _call_async(loaded, payload, size)
        return await self._call_in_process(loaded, payload, size)

    async def _call_in_process(
        self, loaded: LoadedFunction, payload: Any, size: int | None
    ) -> list[RewardOutcome]:
        try:
            message = pickle.dumps((loaded.spec, payload))
        except Exception as error:  # an input (its meta) or kwargs that do not pickle
            unsent = f"{loaded.name}: its input cannot reach a reward process: {first_line(error)}"
            return _failed(ERROR, unsent, size, 0.0)
        worker = await self._send(message)
        start = time.perf_counter()
        try:
            answer = await asyncio.wait_for(self._reply(worker), loaded.timeout_s)
        except TimeoutError:
            await self._replace(worker)
            error = f"{loaded.name} took longer than {loaded.timeout_s:g} s"
            return _failed(TIMEOUT, error, size, time.perf_counter() - start)
        except (EOFError, OSError):
            how = await self._replace(worker)
            error = f"{loaded.name}: the reward process died: {how}"
            return _failed(ERROR, error, size, time.perf_counter() - start)
        except asyncio.CancelledError:  # the run is failing: kill the call, refill later
            self._forget(worker)
            worker.server.kill_soon(worker.pid)
            raise
        self._idle.put_nowait(worker)
        if isinstance(answer, str):  # the process could not read the input
            return _failed(ERROR, f"{loaded.name}: {answer}", size, 0.0)
        return answer

    async def _send(self, message: bytes) -> _Worker:
        """The idle pool process that took ``message``; one that died idle (the send fails)
        is replaced, and the call, which never started, goes to the next."""
        while True:
            worker = await self._take_worker()
            try:
                worker.conn.send_bytes(message)
                return worker
            except OSError:
                await self._replace(worker)

    def _reply(self, worker: _Worker) -> asyncio.Future:
        """The pool process's answer, read when its socket is readable (a pickled list of
        outcomes, small), or EOFError when the process died."""
        reply = self._loop.create_future()
        fd = worker.conn.fileno()

        def readable() -> None:
            if not reply.done():
                try:
                    reply.set_result(worker.conn.recv())
                except (EOFError, OSError) as error:
                    reply.set_exception(error)
            self._loop.remove_reader(fd)

        self._loop.add_reader(fd, readable)
        reply.add_done_callback(lambda _: self._loop.remove_reader(fd))
        return reply

    async def _take_worker(self) -> _Worker:
        """An idle pool process that is alive (one that died idle, or with a server that
        died, is replaced first)."""
        while True:
            worker = await self._idle.get()
            if worker.server is self._server and worker.server.alive(worker.pid):
                return worker
            self._forget(worker)
            worker.server.forget(worker.pid)
            self._idle.put_nowait(await self._spawn())

    async def _replace(self, worker: _Worker) -> str:
        """Kill ``worker``'s process tree, put a fresh process in its place; how it ended."""
        self._forget(worker)
        status = await worker.server.kill(worker.pid)
        self._idle.put_nowait(await self._spawn())
        return _ending(status)

    async def _spawn(self) -> _Worker:
        """A new pool process; if the server turns out to have died (a function may kill
        it), from a new server."""
        try:
            return await self._spawn_from(await self._live_server())
        except (_ServerGone, OSError):
            return await self._spawn_from(await self._live_server())

    async def _spawn_from(self, server: _Server) -> _Worker:
        ours, theirs = socket.socketpair()
        try:
            pid = await server.spawn(theirs.fileno())
        except BaseException:
            ours.close()
            server.close()
            raise
        finally:
            theirs.close()
        self._workers[pid] = _Worker(pid, Connection(ours.detach()), server)
        return self._workers[pid]

    def _forget(self, worker: _Worker) -> None:
        worker.conn.close()
        self._workers.pop(worker.pid, None)

    async def _live_server(self) -> _Server:
        """The process server, started again if it died (its processes died with it)."""
        if self._server is None or not self._server.running:
            if self._server is not None:
                self._server.close()
            self._server = _Server(self._loop, sorted(self._preload))
            await self._server.ready()
        return self._server


@dataclass
class _Worker:
    """A pool process as the pool sees it: its pid, its socket and the server that forked it."""

    pid: int
    conn: Connection
    server: _Server


async def _call_async(loaded: LoadedFunction, payload: Any, size: int | None):
    """An ``async`` function's call on the pool's loop: a task, cancelled at its timeout
    (asyncio.wait rather than wait_for, so a TimeoutError the function raises itself is
    an error, not a timeout)."""
    start = time.perf_counter()
    try:
        task = asyncio.ensure_future(loaded(payload))
    except Exception as error:  # raised before it awaited anything
        return _raised(loaded.name, error, size, time.perf_counter() - start)
    done, _ = await asyncio.wait({task}, timeout=loaded.timeout_s)
    latency = time.perf_counter() - start
    if not done:
        task.cancel()
        await asyncio.wait({task}, timeout=CANCEL_GRACE_S)
        task.add_done_callback(_silenced)
        error = f"{loaded.name} took longer than {loaded.timeout_s:g} s"
        return _failed(TIMEOUT, error, size, latency)
    if task.cancelled():  # it cancelled itself
        return _failed(ERROR, f"{loaded.name} was cancelled", size, latency)
    if task.exception() is not None:
        return _raised(loaded.name, task.exception(), size, latency)
    return outcomes_of(task.result(), loaded.name, size, latency)


def _silenced(task: asyncio.Future) -> None:
    """Retrieve an abandoned task's end, so asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()


def outcomes_of(answer: Any, name: str, size: int | None, latency_s: float) -> list[RewardOutcome]:
    """One call's answer as outcomes: one for a single input (``size`` None), ``size`` for
    a group, where anything but a list (or array) of ``size`` answers is ``invalid`` for
    every sample of the group."""
    if size is None:
        return [outcome_of(answer, name, latency_s)]
    if hasattr(answer, "tolist") and not isinstance(answer, list | tuple):
        answer = answer.tolist()  # a numpy array or tensor of scores
    if not isinstance(answer, list | tuple):
        what = f"{type(answer).__name__} {_short(answer)} instead of a list"
        return _failed(INVALID, f"{name} returned {what} for a group of {size}", size, latency_s)
    if len(answer) != size:
        what = f"a list of {len(answer)}"
        return _failed(INVALID, f"{name} returned {what} for a group of {size}", size, latency_s)
    return [outcome_of(one, name, latency_s) for one in answer]


def _failed(status: str, error: str, size: int | None, latency_s: float) -> list[RewardOutcome]:
    return [RewardOutcome(status, error=error, latency_s=latency_s)] * (size or 1)


def _raised(name: str, error: BaseException, size: int | None, latency_s: float):
    if isinstance(error, InvalidAnswer):  # the function's own word: its answer is no score
        return _failed(INVALID, f"{name}: {str(error).splitlines()[0]}", size, latency_s)
    return _failed(ERROR, f"{name} raised {first_line(error)}", size, latency_s)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _ending(status: int | None) -> str:
    """How a process ended, from its wait status: ``signal SIGABRT``, ``exit code 3``."""
    if status is None:
        return "its process server died"
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(number).name}"
        return f"signal {number}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"


# The pool's handle of its process server: requests out, replies in, over one socket.


class _ServerGone(RuntimeError):
    """The process server exited."""

    def __init__(self) -> None:
        super().__init__("the reward process server exited")


#: The server's interpreter: the pool's ``sys.path`` (PYTHONPATH and what the worker added:
#: a Ray working_dir), then :func:`serve` on the socket it inherited.
_SERVER_MAIN = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[2]); from mindrl.rewards.pool "
    "import serve; serve(int(sys.argv[1]), json.loads(sys.argv[3]))"
)


class _Server:
    """The process server as the pool sees it: a fresh interpreter started with the
    caller's ``sys.path`` that forks pool processes on request.

    Requests and replies are pickled tuples, one per SOCK_SEQPACKET message (so no
    framing), a spawn request carrying the new process's socket (SCM_RIGHTS)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, preload: Sequence[str]) -> None:
        self.loop = loop
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [sys.executable, "-c", _SERVER_MAIN, str(theirs.fileno()), json.dumps(sys.path)]
        self.process = subprocess.Popen(
            [*argv, json.dumps(list(preload))],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C at the driver's terminal is not for it
        )
        theirs.close()
        self.running = True
        self._ready = loop.create_future()
        self._spawned: deque[asyncio.Future] = deque()
        self._exits: dict[int, asyncio.Future] = {}
        loop.add_reader(self.sock.fileno(), self._readable)

    async def ready(self) -> None:
        try:
            await asyncio.wait_for(self._ready, SERVER_START_S)
        except (TimeoutError, _ServerGone):
            code = self.process.poll()
            self.close()
            ended = f"exited with code {code}" if code is not None else "did not answer"
            raise RuntimeError(
                f"the reward process server {ended} within {SERVER_START_S:g} s of its start "
                "(its traceback, if any, is above in this worker's log)"
            ) from None

    def alive(self, pid: int) -> bool:
        """Whether pool process ``pid`` has not been reported ended (it may have died idle)."""
        return self.running and not (pid in self._exits and self._exits[pid].done())

    def forget(self, pid: int) -> None:
        """Drop what is known of ``pid``'s end once the pool no longer asks."""
        exited = self._exits.get(pid)
        if exited is not None and exited.done():
            del self._exits[pid]

    async def spawn(self, fd: int) -> int:
        """The pid of a new pool process serving the socket ``fd``."""
        self._send(("spawn", sys.path), [fd])
        reply = self.loop.create_future()
        self._spawned.append(reply)
        # Up to a start-up's time: the server may first be importing a module to preload.
        return await asyncio.wait_for(reply, SERVER_START_S)

    async def kill(self, pid: int) -> int | None:
        """Kill ``pid``'s process tree; its wait status (None if the server is gone)."""
        try:
            self._send(("kill", pid))
            return await asyncio.wait_for(self._exit_of(pid), SERVER_REPLY_S)
        except (_ServerGone, OSError, TimeoutError):
            return None
        finally:
            self.forget(pid)

    def kill_soon(self, pid: int) -> None:
        """Ask for ``pid``'s tree to be killed without waiting for it."""
        with contextlib.suppress(_ServerGone, OSError):
            self._send(("kill", pid))

    def preload(self, modules: Sequence[str]) -> None:
        with contextlib.suppress(OSError):
            self._send(("preload", list(modules)))

    def close(self) -> None:
        """Close the socket: the server kills its processes' trees, reaps them, exits."""
        if self.sock.fileno() >= 0:
            self.loop.remove_reader(self.sock.fileno())
            self.sock.close()
        self._gone()
        try:
            self.process.wait(timeout=SERVER_REPLY_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def _send(self, message: tuple, fds: Sequence[int] = ()) -> None:
        if not self.running:
            raise _ServerGone()
        socket.send_fds(self.sock, [pickle.dumps(message)], list(fds))

    def _exit_of(self, pid: int) -> asyncio.Future:
        return self._exits.setdefault(pid, self.loop.create_future())

    def _readable(self) -> None:
        try:
            data = self.sock.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            self.loop.remove_reader(self.sock.fileno())
            self._gone()
            return
        kind, *rest = pickle.loads(data)
        if kind == "ready":
            _settle(self._ready, None)
        elif kind == "spawned":
            _settle(self._spawned.popleft(), rest[0])
        elif kind == "spawn_failed":
            error = RuntimeError(f"the reward process server cannot fork: {rest[0]}")
            _settle(self._spawned.popleft(), error=error)
        elif kind == "exit":
            _settle(self._exit_of(rest[0]), rest[1])

    def _gone(self) -> None:
        """Fail whatever waits on the server: it exited."""
        self.running = False
        waiting = [self._ready, *self._spawned, *self._exits.values()]
        for future in waiting:
            if not future.done():
                future.set_exception(_ServerGone())
                future.exception()  # retrieved: not every one has a waiter
        self._spawned.clear()


def _settle(future: asyncio.Future, result: Any = None, error: BaseException | None = None):
    """Give ``future`` its result or error, unless its waiter gave up on it (cancelled)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


# The process server, in its own interpreter: forks pool processes, kills their trees.


def serve(fd: int, preload: Sequence[str]) -> None:
    """The process server's main loop, on the pool's socket ``fd``: fork a pool process per
    ``spawn``, kill one's tree per ``kill``, import per ``preload``; report each pool
    process that ends. When the pool's socket closes (``close()``, or the pool's process
    died) it kills every process it made and what they started, then returns."""
    _set_prctl(_PR_SET_CHILD_SUBREAPER, 1)
    _import_modules(preload)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    server = _ProcessServer(socket.socket(fileno=fd), (wake_read, wake_write))
    signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so SIGCHLD wakes select
    server.reply(("ready",))
    try:
        while True:
            readable, _, _ = select.select([server.sock, wake_read], [], [])
            if wake_read in readable:
                os.read(wake_read, 4096)
                server.reap()
            if server.sock in readable and not server.handle():
                return
    finally:
        server.shutdown()
        # Skip the interpreter's teardown (torch's takes most of a second): nothing is
        # left to run but the flush.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


class _ProcessServer:
    """What the server knows: its socket to the pool and the pool processes alive."""

    def __init__(self, sock: socket.socket, own_fds: tuple[int, ...]) -> None:
        self.sock = sock
        self.own_fds = own_fds  # what a pool process closes: the server's, not its own
        self.workers: dict[int, psutil.Process] = {}

    def reply(self, message: tuple) -> None:
        with contextlib.suppress(OSError):  # the pool is gone: shutdown follows
            self.sock.send(pickle.dumps(message))

    def handle(self) -> bool:
        """Serve one request; False when the pool closed the socket."""
        data, fds, _, _ = socket.recv_fds(self.sock, 1 << 20, 1)
        if not data:
            return False
        kind, *rest = pickle.loads(data)
        if kind == "spawn":
            self.spawn(fds[0], rest[0])
        elif kind == "kill":
            self.kill(rest[0])
        elif kind == "preload":
            _import_modules(rest[0])
        return True

    def spawn(self, fd: int, path: list[str]) -> None:
        server = os.getpid()
        try:
            pid = os.fork()
        except OSError as error:  # out of memory or of processes: the pool says so
            os.close(fd)
            self.reply(("spawn_failed", first_line(error)))
            return
        if pid == 0:
            _pool_process(fd, path, [self.sock.fileno(), *self.own_fds], server)
        os.close(fd)
        self.workers[pid] = psutil.Process(pid)
        self.reply(("spawned", pid))

    def kill(self, pid: int) -> None:
        """Kill pool process ``pid`` and its tree, reap them (so the exit the pool reads
        means the tree is gone), report its wait status."""
        if pid not in self.workers:
            return  # it ended already, and its exit was reported
        killed = _kill_tree(self.workers[pid])
        self.reap({process.pid for process in killed})

    def reap(self, wait_for: set[int] | frozenset[int] = frozenset()) -> None:
        """Reap every ended child (waiting up to ``REAP_S`` for ``wait_for``). Pool processes
        that ended are reported once what they left running (it came to this subreaper) is
        killed and reaped too: when the pool reads an exit, the process's tree is gone."""
        ended = self._reap_children(wait_for)
        if ended:
            self._reap_children(self.kill_orphans())
        for pid, status in ended:
            self.reply(("exit", pid, status))

    def _reap_children(self, wait_for: set[int] | frozenset[int]) -> list[tuple[int, int]]:
        """Reap ended children; the pool processes among them, with their wait status."""
        deadline = time.monotonic() + REAP_S
        pending, ended = set(wait_for), []
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break  # no children left
            if pid == 0:
                pending = {p for p in pending if psutil.pid_exists(p)}  # the rest: reaped
                if not pending or time.monotonic() > deadline:
                    break
                time.sleep(0.002)
                continue
            pending.discard(pid)
            if self.workers.pop(pid, None) is not None:
                ended.append((pid, status))
        return ended

    def kill_orphans(self) -> set[int]:
        """Kill the trees of this server's children that are not pool processes (what a
        pool process that died left running, reparented here); their pids."""
        killed: set[int] = set()
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process().children():
                if child.pid not in self.workers:
                    killed |= {process.pid for process in _kill_tree(child)}
        return killed

    def shutdown(self) -> None:
        for worker in list(self.workers.values()):
            _kill_tree(worker)
        self.kill_orphans()
        deadline = time.monotonic() + REAP_S
        while time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                time.sleep(0.002)


def _kill_tree(root: psutil.Process) -> list[psutil.Process]:
    """Stop ``root`` and every descendant until the tree no longer grows (a stopped
    process cannot fork), then kill them all and ``root``'s process group; the processes
    killed. psutil refuses to signal a pid that was reused, so only the tree's own
    processes are signalled (one reaped since it was listed is skipped)."""
    seen: set[int] = set()
    stopped: list[psutil.Process] = []
    while True:
        try:
            found = [root, *root.children(recursive=True)]
        except psutil.Error:
            found = [root]
        new = [process for process in found if process.pid not in seen]
        if not new:
            break
        for process in new:
            seen.add(process.pid)
            with contextlib.suppress(psutil.Error):
                process.suspend()
                stopped.append(process)
    with contextlib.suppress(psutil.Error, OSError):
        if os.getpgid(root.pid) == root.pid:  # its own group: the pool process's session
            os.killpg(root.pid, signal.SIGKILL)
    killed = []
    for process in stopped:
        with contextlib.suppress(psutil.Error):
            process.kill()
            killed.append(process)
    return killed


def _import_modules(modules: Sequence[str]) -> None:
    """Import what the pool processes will call, so each is forked with it imported; a
    module that fails here fails again, with its message, in the call that needs it."""
    for module in modules:
        with contextlib.suppress(Exception, SystemExit):
            importlib.import_module(module)


def _set_prctl(option: int, value: int) -> None:
    """Linux ``prctl``; elsewhere nothing (the tree is then what psutil finds)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


# A pool process: forked by the server, one call at a time, never returns.


def _pool_process(fd: int, path: list[str], server_fds: Sequence[int], server: int) -> None:
    """The forked child: leave the server's loop behind and serve calls until the pool
    closes its socket; exits with ``os._exit`` (never runs the server's code again)."""
    code = 0
    try:
        signal.set_wakeup_fd(-1)
        for server_fd in server_fds:
            os.close(server_fd)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()  # its own session and group: the unit a timeout kills
        _set_prctl(_PR_SET_CHILD_SUBREAPER, 1)  # orphans of its calls stay in its tree
        _set_prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # it dies with the server
        if os.getppid() != server:  # it died before the line above: nobody reads the socket
            return
        # A crashing function would write a core of the whole interpreter (hundreds of MB)
        # into the run's directory on every crash.
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
        sys.path[:] = path
        _serve_calls(Connection(fd))
    except BaseException:
        code = 70
        with contextlib.suppress(BaseException):
            import traceback

            traceback.print_exc()
    finally:
        os._exit(code)


def _serve_calls(conn: Connection) -> None:
    functions: dict[str, Callable[..., Any]] = {}
    while True:
        try:
            data = conn.recv_bytes()
        except EOFError:
            return
        try:
            spec, payload = pickle.loads(data)
        except Exception as error:  # a class in the input's meta this process cannot import
            answer: Any = f"the reward process cannot read its input: {first_line(error)}"
        else:
            answer = _call_here(spec, payload, functions)
        try:
            conn.send(answer)
        except OSError:  # the pool closed this process's socket: it is being replaced
            return


def _call_here(
    spec: FunctionSpec, payload: Any, functions: dict[str, Callable[..., Any]]
) -> list[RewardOutcome]:
    """One synchronous call in this process; the function is imported on first use."""
    size = len(payload) if spec.group else None
    try:
        if spec.target not in functions:
            functions[spec.target] = import_target(spec)
    except RewardFunctionError as error:
        return _failed(ERROR, str(error), size, 0.0)
    start = time.perf_counter()
    try:
        answer = functions[spec.target](payload, **spec.kwargs)
    except Exception as error:
        return _raised(spec.name, error, size, time.perf_counter() - start)
    except SystemExit as error:  # sys.exit() in a function ends the call, not the process
        return _raised(spec.name, error, size, time.perf_counter() - start)
    return outcomes_of(answer, spec.name, size, time.perf_counter() - start)
