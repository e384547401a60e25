"""Device-equivalent live bytes of a CPU process: every tensor storage an op creates, until
it is freed.

On a GPU the allocator's ``max_memory_allocated`` is the peak of the bytes live tensors
hold; a CPU has no such counter (the ledger in ``backends/device/ledger.py`` sees only
the tensors declared to it, sampled at step boundaries). :class:`LiveBytes` is a
``TorchDispatchMode``: every op's outputs are looked at, a storage seen for the first
time is counted with its size, ``UntypedStorage.resize_`` (allgather-swap's release and
restore, which the dispatcher does not see) updates it, and a weak reference drops it
when the storage is freed. So inside the mode the count is what a device allocator would
hold for the same program, op by op, transients included (the peak is taken after every
op).

A storage an op is *given* before any op inside the mode made it was allocated before
the mode (or outside the dispatcher): it is remembered and never counted, not even when
a view or an in-place op hands it back (a linear's ``weight.t()``, ``grad.zero_()``;
``adopt`` counts such tensors on purpose). Counting it at that output instead, as this
tracker once did, charged a window entered after a warm-up step with the weights and
the grads a second time, allocations the window never made (``long_context.py``'s
constant of two float32 models). The inputs of ``lift_fresh`` are the exception: that is
how ``torch.tensor`` and ``torch.as_tensor`` hand the mode the tensor they just built.

What a CPU run cannot tell apart by itself is what an accelerator run keeps on the
*host*: the pinned swap buffers, an engine put to sleep. :meth:`LiveBytes.host` and
:meth:`LiveBytes.host_allocations` say so; those storages are tracked but not counted.
Kernel-internal workspaces of accelerator libraries (cuBLAS, flash attention) are not
tensors and are not seen, on either side.

torch's own ``torch.distributed._tools.mem_tracker.MemTracker`` does the same
bookkeeping per module; it cannot be told that a CPU storage stands for host memory, and
its module hooks cost more than this needs, hence this small one.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import wraps

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary


@dataclass
class _Entry:
    nbytes: int
    on_device: bool  # counted: device memory allocated inside the mode
    ref: weakref.ref | None = None


#: Ops whose input is a tensor just built outside the dispatcher (``torch.tensor``,
#: ``torch.as_tensor``, ``torch.from_numpy`` inside the mode): new, not from before it.
_LIFTS = frozenset(op.default for op in (torch.ops.aten.lift_fresh, torch.ops.aten.lift_fresh_copy))


@dataclass(frozen=True)
class Window:
    """One measured window: its name, the peak inside it and the bytes live at its end."""

    name: str
    peak: int
    end: int


class LiveBytes(TorchDispatchMode):
    """Counts the bytes of live tensor storages created inside the mode (see module doc).

    Use::

        with LiveBytes() as live:
            build(); live.window("build")
            step();  live.window("step")     # Window("step", peak inside, bytes at end)
    """

    def __init__(self) -> None:
        super().__init__()
        self._entries: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.current = 0  # device bytes live now
        self.peak = 0  # since the last window
        self.windows: list[Window] = []
        self._host_depth = 0
        self._resize: Callable | None = None

    # ---- the mode -------------------------------------------------------------------
    def __enter__(self) -> LiveBytes:
        self._patch_resize()
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        if self._resize is not None:
            torch.UntypedStorage.resize_ = self._resize
            self._resize = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func not in _LIFTS:  # an input not seen yet was made before the mode
            for value in tree_flatten((args, kwargs))[0]:
                if isinstance(value, torch.Tensor):
                    self._see(value, made_here=False)
        out = func(*args, **(kwargs or {}))
        for value in tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor):
                self._see(value)
        return out

    def _patch_resize(self) -> None:
        # Storage.resize_ bypasses the dispatcher; the swap frees and restores with it.
        original = torch.UntypedStorage.resize_
        tracker = self

        @wraps(original)
        def resize_(storage: torch.UntypedStorage, size: int):
            result = original(storage, size)
            tracker._resized(storage)
            return result

        self._resize = original
        torch.UntypedStorage.resize_ = resize_

    # ---- bookkeeping ----------------------------------------------------------------
    def _see(self, tensor: torch.Tensor, made_here: bool = True) -> None:
        """Track ``tensor``'s storage: counted when an op inside the mode made it (an
        output seen first), remembered uncounted when it existed before (an input)."""
        if tensor.is_sparse or tensor.device.type == "meta":
            return
        storage = tensor.untyped_storage()
        entry = self._entries.get(storage)
        if entry is None:
            self._add(storage, on_device=made_here and self._host_depth == 0)
        elif entry.nbytes != storage.nbytes():  # an in-place resize through an op
            self._resized(storage)

    def _add(self, storage: torch.UntypedStorage, on_device: bool) -> None:
        entry = _Entry(storage.nbytes(), on_device)
        entry.ref = weakref.ref(storage, lambda _ref, e=entry: self._freed(e))
        self._entries[storage] = entry
        if on_device:
            self._change(entry.nbytes)

    def _freed(self, entry: _Entry) -> None:
        if entry.on_device:
            self._change(-entry.nbytes)

    def _resized(self, storage: torch.UntypedStorage) -> None:
        entry = self._entries.get(storage)
        if entry is None:
            return
        delta, entry.nbytes = storage.nbytes() - entry.nbytes, storage.nbytes()
        if entry.on_device:
            self._change(delta)

    def _change(self, delta: int) -> None:
        self.current += delta
        self.peak = max(self.peak, self.current)

    # ---- what a run on an accelerator keeps on the host -----------------------------
    @contextlib.contextmanager
    def host_allocations(self) -> Iterator[None]:
        """Storages created inside are host memory on an accelerator (pinned buffers)."""
        self._host_depth += 1
        try:
            yield
        finally:
            self._host_depth -= 1

    def host(self, tensors: Iterable[torch.Tensor], on_host: bool = True) -> None:
        """Mark the storages of ``tensors`` as moved to the host (``on_host=False``: back
        on the device), as an engine's ``sleep`` / ``wake_up`` does on an accelerator."""
        for tensor in tensors:
            storage = tensor.untyped_storage()
            entry = self._entries.get(storage)
            if entry is None:
                self._add(storage, on_device=not on_host)
            elif entry.on_device == on_host:
                entry.on_device = not on_host
                self._change(-entry.nbytes if on_host else entry.nbytes)

    def adopt(self, tensors: Iterable[torch.Tensor]) -> None:
        """Count tensors made before the mode was entered (device-resident), also those
        an op inside it was already given (remembered uncounted, see the module doc)."""
        self.host(tensors, on_host=False)

    # ---- windows ----------------------------------------------------------------------
    def window(self, name: str) -> Window:
        """Close a window: the peak since the last one; the next starts from what is live."""
        window = Window(name, self.peak, self.current)
        self.windows.append(window)
        self.peak = self.current
        return window

    def bytes_of(self, tensors: Iterable[torch.Tensor]) -> int:
        """Device bytes of the distinct storages of ``tensors`` as counted here."""
        seen: dict[int, int] = {}
        for tensor in tensors:
            entry = self._entries.get(tensor.untyped_storage())
            if entry is not None and entry.on_device:
                seen[id(entry)] = entry.nbytes
        return sum(seen.values())
