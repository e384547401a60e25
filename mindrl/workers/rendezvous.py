"""Race-free rendezvous for a process group: the store's host binds its port first.

Picking a "free" port, closing it and letting rank 0 bind it later leaves a window in
which any other process on the node (Ray opens connections all the time) can take it,
and the group then fails to start. Here the host binds port 0 and the OS assigns one
that is never released; the other ranks are told the port it got.
"""

from __future__ import annotations

import datetime

import torch.distributed as dist


def host_store(world: int, timeout_s: float) -> dist.TCPStore:
    """The store of a ``world``-rank group, listening on a port the OS picks
    (``store.port``). Keep it alive until every rank has left the group."""
    return dist.TCPStore(
        "127.0.0.1",
        0,
        world,
        is_master=True,
        timeout=datetime.timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )


def join_store(addr: str, port: int, world: int, timeout_s: float) -> dist.TCPStore:
    """A client of the store hosted at ``addr:port``."""
    return dist.TCPStore(
        addr, port, world, is_master=False, timeout=datetime.timedelta(seconds=timeout_s)
    )
