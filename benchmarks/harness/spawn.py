"""Run a function on N local ranks (processes of their own) over the device layer's backend.

``run_ranks(fn, world, *args)`` returns ``[fn(rank, world, *args) for each rank]`` as
computed inside the ranks (results must be picklable); a rank that raises makes the call
raise with that rank's traceback. Used by the benchmarks and, pinned to the CPU with
one torch thread per rank, by the multi-rank tests (``tests/support/spawn.py``).

On a machine without an accelerator, ranks are forked from a fork server that has
imported torch and Megatron once (:data:`PRELOAD`): a spawned rank spends seconds of CPU on
those imports, and the multi-rank tests start a few hundred ranks. On a machine with a GPU
or NPU every rank is spawned, CPU ranks included: a process forked after its parent asked
CUDA or CANN anything fails its next device call, and torch's optimizer makes one even for
CPU tensors.
"""

from __future__ import annotations

import os
import pickle
import signal
import time
import traceback
from typing import Any

import torch.multiprocessing as mp

from backends.device import available_devices, resolve_device
from mindrl.workers.rendezvous import host_store, join_store

#: Seconds a rank waits for its peers at the rendezvous.
RENDEZVOUS_TIMEOUT_S = 300.0
#: How often the parent looks for a rank that died without a word while it waits.
POLL_S = 0.1

#: What the CPU ranks' fork server imports before it forks any rank: what almost every
#: rank function needs (a module missing here is imported by the rank as usual).
PRELOAD = [
    "torch",
    "torch.distributed",
    "backends.megatron.eager_import",  # the server is CPU-only: Megatron the CPU's way
    "backends.megatron.engine",
    "backends.megatron.families",
    "backends.generation",
    "mindrl.workers.rendezvous",
]


def _leave_process_group() -> None:
    """Tear the process group down in step with the other ranks before exiting.

    Left to interpreter exit, gloo's threads are destroyed in no set order: about one
    exit in fifteen aborted ("terminate called without an active exception", SIGABRT)
    after the rank had returned its result. The barrier makes sure no peer still talks
    to this rank's connections. (The store lives in the parent, see ``run_ranks``.)
    """
    import torch.distributed as dist

    if not dist.is_initialized():  # ``fn`` tore it down (a vLLM engine's shutdown does)
        return
    dist.barrier()
    dist.destroy_process_group()


def _entry(
    rank: int,
    world: int,
    port: int,
    device: str | None,
    threads: int | None,
    fn: Any,
    args: tuple,
    queue: Any,
    environ: dict[str, str],
):
    try:
        # A forked rank has the fork server's environment, from when it started.
        os.environ.clear()
        os.environ.update(environ)
        import torch

        from backends.device import get_device

        if threads is not None:
            torch.set_num_threads(threads)  # small machines: ranks must not oversubscribe
        store = join_store("127.0.0.1", port, world, RENDEZVOUS_TIMEOUT_S)
        get_device(device).init_process_group(
            rank, world, timeout_s=RENDEZVOUS_TIMEOUT_S, store=store
        )
        # Plain pickle copies tensor bytes; torch's queue pickler would share memory
        # that disappears when this process exits.
        result = pickle.dumps(fn(rank, world, *args))
        _leave_process_group()
        queue.put((rank, "ok", result))
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))
        raise


def run_ranks(
    fn: Any,
    world: int,
    *args: Any,
    device: str | None = None,
    threads: int | None = None,
    timeout_s: float = 300.0,
) -> list[Any]:
    """Start ``world`` ranks, run ``fn(rank, world, *args)`` in each, return the results."""
    ctx = _start_context(device)
    queue = ctx.SimpleQueue()
    # This process hosts the ranks' store: its port is bound before any rank starts (no
    # other process can take it meanwhile) and it outlives every rank's exit.
    store = host_store(world, RENDEZVOUS_TIMEOUT_S)
    context = mp.start_processes(
        _entry,
        args=(world, store.port, device, threads, fn, args, queue, dict(os.environ)),
        nprocs=world,
        join=False,
        start_method=ctx.get_start_method(),
    )
    results: dict[int, Any] = {}
    try:
        while len(results) < world:
            if queue.empty():
                _raise_for_a_silent_death(context.processes, results, queue)
                time.sleep(POLL_S)
                continue
            rank, status, value = queue.get()
            if status == "error":
                raise RuntimeError(f"rank {rank} failed:\n{value}")
            results[rank] = pickle.loads(value)
        context.join(timeout=timeout_s)
    finally:
        for process in context.processes:
            if process.is_alive():
                process.terminate()
    return [results[r] for r in range(world)]


def _raise_for_a_silent_death(processes: list[Any], results: dict[int, Any], queue: Any) -> None:
    """Raise for a rank that exited without putting its result: killed by a signal
    (segfault, the OOM killer) it never reaches its ``except``, and the parent would wait
    on the queue forever. A rank puts before it exits, so a dead rank's result, if any, is
    already in the queue when it is seen dead."""
    dead = [r for r, p in enumerate(processes) if r not in results and p.exitcode is not None]
    if not dead or not queue.empty():
        return
    code = processes[dead[0]].exitcode
    how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
    raise RuntimeError(f"rank {dead[0]} died without a result ({how})")


def _start_context(device: str | None) -> Any:
    """The multiprocessing context that starts the ranks: a preloaded fork server on a
    machine with no accelerator, a fresh interpreter per rank elsewhere (see the module
    docstring)."""
    # CPU ranks on an accelerator machine are spawned too: torch's optimizer asks CUDA
    # whether a graph is being captured whenever CUDA is available, even for CPU tensors,
    # and that call fails in a process forked from a server whose imports asked CUDA for
    # its devices ("CUDA error: initialization error", seen on an H100).
    if resolve_device(device) != "cpu" or available_devices() != ["cpu"]:
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # read when the server starts: on first use
    return ctx
