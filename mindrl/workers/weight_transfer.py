"""Disaggregated placement: the trainer ranks' side of the weight hand-over.

After every update the actor's ranks all-gather their training shards into whole
generation tensors (the resharder's gather, with no swap: nothing generates on these
devices) and actor rank 0 broadcasts them, under HF names, to the rollout workers over a
process group of their own (:meth:`backends.device.Device.transfer_group`: gloo here,
NCCL on GPUs). The rollout workers' side is :mod:`mindrl.workers.rollout_worker`.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from backends.megatron.families import get_family
from backends.megatron.lora import MergedWeights
from mindrl.workers.rendezvous import host_store
from mindrl.workers.rollout import make_adapter_resharder, make_resharder

#: What a receiver needs to allocate one tensor: HF name, shape, dtype name.
Manifest = list[tuple[str, tuple[int, ...], str]]


def manifest_of(named: list[tuple[str, torch.Tensor]]) -> Manifest:
    return [(name, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in named]


def empty_like_manifest(manifest: Manifest, device: torch.device) -> list[tuple[str, torch.Tensor]]:
    return [
        (name, torch.empty(shape, dtype=getattr(torch, dtype), device=device))
        for name, shape, dtype in manifest
    ]


class WeightSource:
    """Mixed into the actor's model worker (``self.engine``, ``self.spec``, ``self.config``,
    ``self.device``, ``self.rank``, ``self.size``) when the rollout runs elsewhere."""

    def _init_weight_source(self) -> None:
        """Called by ``setup`` once the training engine exists."""
        # Whole tensors whatever rollout.tp: a rollout worker's engine splits them itself.
        self.resharder = make_resharder(
            self.engine, self.spec, self.config, self.size, swap=False, whole=True
        )
        self.adapter_resharder = (
            make_adapter_resharder(self.engine, self.spec, self.config, self.size)
            if self.engine.lora is not None
            else None
        )
        self.family = get_family(self.spec.family)
        self._transfer_store: Any = None
        self._transfer: Any = None

    def open_weight_transfer(self, receivers: int) -> int:
        """Rank 0: host the transfer group's store (it and ``receivers`` rollout workers);
        returns its port."""
        self._transfer_store = host_store(receivers + 1, self._rendezvous_timeout_s())
        return self._transfer_store.port

    def join_weight_transfer(self, receivers: int) -> None:
        """Rank 0: join the transfer group as its rank 0 (a collective with the receivers)."""
        timeout = self._rendezvous_timeout_s()
        self._transfer = self.device.transfer_group(self._transfer_store, 0, receivers + 1, timeout)

    def _generation_tensors(self) -> list[tuple[str, torch.Tensor]]:
        """Whole HF-named tensors of the current weights (a collective over the actor)."""
        buffers = self.resharder.reshard()
        if self.adapter_resharder is not None:  # a rollout worker loads a whole policy
            adapters = self.adapter_resharder.reshard()
            buffers = MergedWeights({**buffers, **adapters}, self.engine.lora.scale)
        return [(name, t.contiguous()) for name, t in self.family.iter_hf(buffers, self.spec)]

    def weight_manifest(self) -> Manifest:
        """Names, shapes and dtypes of what :meth:`send_weights` broadcasts (every rank
        calls it: the gather is a collective)."""
        return manifest_of(self._generation_tensors())

    def send_weights(self) -> dict[str, float]:
        """Every actor rank gathers; rank 0 broadcasts each tensor to the rollout workers."""
        start = time.perf_counter()
        named = self._generation_tensors()
        if self._transfer is not None:
            on_device = self.device.transfer_on_device
            for _, tensor in named:
                self.device.broadcast(self._transfer, tensor if on_device else tensor.cpu(), 0)
        bytes_sent = sum(t.nbytes for _, t in named)
        return {"busy_s": time.perf_counter() - start, "handover_bytes": float(bytes_sent)}
