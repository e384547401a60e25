"""Disaggregated placement: a rollout worker, one Ray actor per generation TP group
of devices (one device at ``rollout.tp: 1``), with a generation engine of its own and no
training engine.

It receives whole HF-named weights from actor rank 0 over the transfer group
(:mod:`mindrl.workers.weight_transfer`) and remembers their version (the number of
updates they include); every sample it puts into the dock carries that version, which
the stages' TD controllers keep as metadata, so the update stage can tell how stale
what it trains on is.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import ray
import torch

from backends.device import get_device
from backends.generation import SamplingParams
from mindrl.config.layout import rollout_worker_spans_devices
from mindrl.dock import DockHandle
from mindrl.run_plan import stage_deadline_s
from mindrl.workers.context import StageContext
from mindrl.workers.continuous import ContinuousGenerator, Feed
from mindrl.workers.generation import generate_into_dock
from mindrl.workers.model_setup import initial_model
from mindrl.workers.rendezvous import join_store
from mindrl.workers.rollout import make_generation_engine
from mindrl.workers.stage_report import memory_window, stage_report
from mindrl.workers.timed_dock import TimedDockClient
from mindrl.workers.weight_transfer import Manifest, empty_like_manifest


class RolloutWorker:
    """Rollout rank ``rank`` of ``size``: the transfer group's rank ``rank + 1``; its
    ``context`` is the plan's ``rollout`` stage (what it reads and writes)."""

    def __init__(self, rank: int, size: int, context: StageContext, device_name: str) -> None:
        warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron\.")
        self.rank, self.size, self.context = rank, size, context
        self.config = config = context.config
        self.device = get_device(device_name)
        self.device.use_host_threads(config.resources.devices_per_node)
        self.version = -1  # no weights yet
        self.loop: ContinuousGenerator | None = None  # continuous generation's decode loop

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def setup(self, dock: DockHandle, address: str, port: int, manifest: Manifest) -> dict:
        """Build the engine and join the transfer group (a collective with actor rank 0)."""
        self.dock = TimedDockClient(dock)
        initial = initial_model(self.config.model)
        self.generator = make_generation_engine(self.config, initial)
        del initial  # the weights come from the trainers, not from the initial checkpoint
        memory_window(self.device)
        self.manifest = manifest
        timeout = stage_deadline_s(self.config)
        store = join_store(address, port, self.size + 1, timeout)
        self.transfer = self.device.transfer_group(store, self.rank + 1, self.size + 1, timeout)
        self._store = store  # the group keeps using it
        return {"node_id": self.node_id()}

    def receive_weights(self, version: int) -> dict[str, float]:
        """Take the weights actor rank 0 broadcasts (a collective) and load them; while
        the decode loop runs, it loads them between two steps (the broadcast itself runs
        beside its decoding)."""
        start = time.perf_counter()
        named = self._receive()
        if self.loop is not None:
            self.loop.offer_weights(version, named)
        else:
            self.generator.wake_up()
            self.generator.load_weights(iter(named))
        self.version = version
        return {"busy_s": time.perf_counter() - start}

    def _receive(self) -> list[tuple[str, torch.Tensor]]:
        """The broadcast weights, where the engine reads them: on the device for one
        unsharded engine in this process; on the host for a TP group's engine, whose
        ranks run in processes of their own and take host copies. A device-to-device
        transfer group then stages each tensor through the device alone, so the device
        never holds a whole copy of the model beside its shard."""
        on_device = self.device.transfer_on_device
        staged = on_device and rollout_worker_spans_devices(self.config)
        host = torch.device("cpu")
        named = empty_like_manifest(
            self.manifest, self.device.device() if on_device and not staged else host
        )
        for _, tensor in named:
            if staged:
                buffer = torch.empty_like(tensor, device=self.device.device())
                self.device.broadcast(self.transfer, buffer, 0)
                tensor.copy_(buffer)
                del buffer
            else:
                self.device.broadcast(self.transfer, tensor, 0)
        return named

    # ---- continuous generation (mindrl/workers/continuous.py) ------------------------------
    def start_continuous(self, params: SamplingParams, slots: int) -> None:
        """Start the decode loop (the engine holds the weights of ``self.version``)."""
        rollout = self.config.rollout
        self.loop = ContinuousGenerator(
            self.dock,
            self.generator,
            params,
            self.config.data.n_samples_per_prompt,
            slots,
            rollout.max_prompt_length + rollout.max_response_length,
            self.version,
        )

    def feed(self, feed: Feed) -> None:
        """Whole groups for the decode loop (their prompts are in the dock)."""
        self.loop.feed(feed)

    def continuous_status(self) -> dict:
        """The loop's counters; raises its error if it failed."""
        return {**self.loop.status(), **stage_report(time.perf_counter(), self.dock, self.device)}

    def stop_continuous(self) -> dict[str, np.ndarray]:
        """Interrupt the loop: unfinished groups go to the dock as they stand (paused
        responses); returns the paused and the fed, unstarted indexes."""
        loop, self.loop = self.loop, None
        return loop.stop() if loop is not None else {}

    def generate(self, indexes: np.ndarray, params: SamplingParams) -> dict[str, float]:
        """Sample one response per index with the current weights; put them (with their
        version) into the dock."""
        start = time.perf_counter()
        group = self.config.data.n_samples_per_prompt
        report = generate_into_dock(
            self.dock,
            self.generator.generate,
            indexes,
            params,
            group,
            version=self.version,
            # The plan's rollout entry writes each token's version where tokens may lag.
            token_versions="rollout_version" in self.context.stage("rollout").writes,
        )
        return {**report, "version": self.version, **stage_report(start, self.dock, self.device)}
