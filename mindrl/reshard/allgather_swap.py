"""Allgather–swap: reshard into generation buffers and park the training state on the host.

Per iteration (paper, "Allgather–Swap Technique"):

1. all-gather the training shards into a temporary buffer, one bucket at a time;
2. copy this rank's generation shard out of it into the generation buffers;
3. swap the training weights (and grads + optimizer state when given) device -> host
   into pinned buffers allocated once, releasing device storage with
   ``untyped_storage().resize_(0)`` so every reference stays valid;
4. free the temporary buffer (per bucket, right after step 2).

Before the next update :meth:`AllgatherSwapResharder.swap_in` restores the training
state host -> device.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import torch

from mindrl.reshard.resharder import BaseResharder
from mindrl.reshard.swap import HostSwap


class AllgatherSwapResharder(BaseResharder):
    """Allgather–swap resharder (see module docstring); arguments as :class:`BaseResharder`.

    Args:
        swap_extra: returns the extra training tensors to swap with the weights, e.g.
            ``lambda: grad_tensors(params) + engine.optimizer_state_tensors()``; called
            at every swap so state created lazily by the optimizer is included.
        **kwargs: passed to :class:`BaseResharder`.

    Attributes:
        timeline: device bytes at every step of the last :meth:`reshard`.
        seconds: wall time of the last ``gather`` / ``swap_out`` / ``swap_in``.
    """

    def __init__(
        self, *args, swap_extra: Callable[[], Iterable[torch.Tensor]] | None = None, **kwargs
    ) -> None:
        super().__init__(*args, **kwargs)
        self.swap_extra = swap_extra
        self.host = HostSwap(self.device)
        self.seconds: dict[str, float] = {}
        self.swapped_bytes = 0

    def reshard(self, out: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Steps 1-4: returns ``{name: generation shard}`` (filled in place when ``out`` given).

        Raises:
            RuntimeError: the training state is still on the host (call :meth:`swap_in`).
        """
        if self.host.swapped_bytes:
            raise RuntimeError("training state is still swapped out; call swap_in() first")
        self.timeline.clear()
        self.timeline.record("start")
        if out is None:
            out = self.allocate_generation_buffers()
            self.timeline.record("generation buffers")
        start = time.perf_counter()
        self._gather_and_copy(out, skip=set())
        self.seconds["gather"] = time.perf_counter() - start
        self.swap_out()
        return out

    def swap_out(self) -> int:
        """Step 4 alone: the training state device -> host (the generation shards made
        earlier are still in the engine, e.g. a later generation round with the same
        weights). Returns bytes moved."""
        start = time.perf_counter()
        self.swapped_bytes = self.host.swap_out(self._swap_tensors())
        self.seconds["swap_out"] = time.perf_counter() - start
        self.timeline.record("swap_out")
        return self.swapped_bytes

    def _swap_tensors(self) -> list[torch.Tensor]:
        extra = list(self.swap_extra()) if self.swap_extra is not None else []
        return [*self.params.values(), *extra]

    def swap_in(self) -> int:
        """Restore the training state host -> device (synchronously).

        Returns:
            Bytes restored.
        """
        start = time.perf_counter()
        restored = self.host.swap_in()
        self.seconds["swap_in"] = time.perf_counter() - start
        self.timeline.record("swap_in")
        return restored


def grad_tensors(params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """The ``.grad`` (or Megatron ``.main_grad``) tensors that exist."""
    grads = []
    for param in params:
        grad = getattr(param, "main_grad", None)
        grad = grad if grad is not None else param.grad
        if grad is not None:
            grads.append(grad)
    return grads
