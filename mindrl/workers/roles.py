"""The model workers: one Ray actor per device for the actor, reference and critic roles.

Thin shells (docs/architecture.md §1): each rank joins its role's process group, builds a
:class:`~backends.megatron.MegatronEngine` (the actor also a :class:`Rollout`), and
serves stages. Every stage method takes sample indexes the driver claimed from the
dock, fetches its own payloads from the warehouses, and puts its results back; the
driver only ever sees indexes and scalar metrics. The algorithm's maths arrives as an
argument (an ``Algorithm`` object from ``trainers``), never as an import.
"""

from __future__ import annotations

import contextlib
import functools
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import ray
import torch
from ray.actor import ActorHandle

from backends.device import get_device
from backends.generation import SamplingParams
from backends.megatron import MegatronEngine, ResponseBatch, checkpoint
from mindrl.config.layout import COLLOCATED, DISAGGREGATED
from mindrl.config.schema import AlgorithmConfig, MindRLConfig, RoleConfig
from mindrl.config.specs import gpt_spec, vla_spec
from mindrl.data import load_tokenizer
from mindrl.dock import DockHandle, DockSlice, restore_samples, snapshot_samples
from mindrl.reshard import grad_tensors
from mindrl.reshard.swap import HostSwap
from mindrl.run_plan import LOSS_MASK, REFERENCE_STAGE, stage_deadline_s
from mindrl.workers.context import ModelContext
from mindrl.workers.embodied import EmbodiedActor
from mindrl.workers.episodes import EnvSettings, TextCodec, run_episodes_into_dock
from mindrl.workers.generation import PartialRollout, generate_into_dock
from mindrl.workers.model_setup import initial_model
from mindrl.workers.rendezvous import host_store, join_store
from mindrl.workers.rollout import Rollout
from mindrl.workers.sequences import loss_mask, pack_rows
from mindrl.workers.stage_report import memory_window, stage_report
from mindrl.workers.timed_dock import TimedDockClient
from mindrl.workers.updates import actor_update, critic_update, micro_batching
from mindrl.workers.weight_transfer import WeightSource

#: The tree in the actor's step folder with the dock's samples in flight (mindrl.dock.snapshot).
IN_FLIGHT = "in_flight"

Method = TypeVar("Method", bound=Callable[..., Any])


def on_device(method: Method) -> Method:
    """Run a stage (or a checkpoint) with the role's state on its device. A role the plan
    offloads (``RunPlan.offloaded_roles``) brings it back from the host first and puts it
    back after, so between its stages the device holds none of it."""

    @functools.wraps(method)
    def with_state_on_device(self: ModelWorker, *args: Any, **kwargs: Any) -> Any:
        if self._host is None:
            return method(self, *args, **kwargs)
        self._host.swap_in()
        try:
            return method(self, *args, **kwargs)
        finally:
            self._offload()

    return with_state_on_device


@dataclass(frozen=True)
class EpisodeContext:
    """What the actor's ranks run episodes with: the environment workers, the turn limits,
    the tokenizer (an episode's ``reset`` gets the record the driver put in the dock)."""

    workers: list[ActorHandle]
    settings: EnvSettings
    codec: TextCodec


def base_origin(config: MindRLConfig) -> dict[str, Any]:
    """What a LoRA checkpoint names as its base: the weights' source (a random init is
    the seed's)."""
    model = config.model
    if model.hf_path is None and model.gguf_package is None:
        return {"random_init_seed": config.seed}
    return {"hf_path": model.hf_path, "gguf_package": model.gguf_package}


class ModelWorker(WeightSource):
    """One rank of the ``role`` group (``actor``, ``reference`` or ``critic``).

    Args:
        rank: rank in the role's group; ``size``: the group's size.
        context: the role's share of the run plan: the stages it serves (what each reads
            and writes), the algorithm and its options, the engine specs, the plan's mode
            and whether the plan offloads the role (its weights, grads and optimizer
            state then wait in pinned host memory between its stages, :func:`on_device`).
        device_name: the device platform the driver resolved.
    """

    def __init__(self, rank: int, size: int, context: ModelContext, device_name: str) -> None:
        # Megatron warns at import that TE/Apex are absent; expected off accelerators.
        warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron\.")
        # Megatron's DDP / distributed optimizer call c10d collectives torch renamed.
        warnings.filterwarnings(
            "ignore", category=FutureWarning, message=r"`torch\.distributed\.\w+` is deprecated"
        )
        self.rank, self.size, self.context = rank, size, context
        self.role, self.config = context.role, context.config
        self.section: RoleConfig = getattr(self.config, self.role)
        self.specs, self.mode = context.specs, context.mode
        self.algorithm, self.options = context.algorithm, context.options
        self.device = get_device(device_name)
        self._host = HostSwap(self.device) if context.offloaded else None
        self.device.use_host_threads(self.config.resources.devices_per_node)
        self.engine: MegatronEngine | None = None
        self.rollout: Rollout | None = None
        self._store: torch.distributed.TCPStore | None = None  # rank 0 hosts it
        self.episodes: EpisodeContext | None = None  # a multi-turn run's environment
        self.embodied: EmbodiedActor | None = None  # an embodied run's environments

    # ---- set-up ------------------------------------------------------------------------
    def rendezvous(self) -> tuple[str, int, str]:
        """Rank 0: host the group's store; its address, port and this node's id."""
        self._store = host_store(self.size, self._rendezvous_timeout_s())
        node = ray.get_runtime_context().get_node_id()
        return ray.util.get_node_ip_address(), self._store.port, node

    def _rendezvous_timeout_s(self) -> float:
        return stage_deadline_s(self.config)

    def setup(self, master_addr: str, master_port: int, dock: DockHandle) -> dict:
        """Join the process group, build the engine(s), load the initial weights."""
        self.dock = TimedDockClient(dock)
        timeout = self._rendezvous_timeout_s()
        store = (
            self._store
            if self._store is not None
            else join_store(master_addr, master_port, self.size, timeout)
        )
        self.device.init_process_group(self.rank, self.size, timeout_s=timeout, store=store)
        self.build_engines()
        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "dp_rank": self.engine.data_parallel_rank(),
            "dp_size": self.engine.data_parallel_size(),
            "gen_dp_rank": self.rank // self.config.rollout.tp,
        }

    def build_engines(self) -> None:
        """This rank's training engine (the actor also its rollout) with the initial
        weights, once its process group is up (``setup``; the stage-memory harness in
        benchmarks/harness builds a rank this way without Ray)."""
        if self.config.env.embodied:
            self._build_embodied()
            return
        initial = initial_model(self.config.model)
        self.spec = initial.spec
        self.engine = MegatronEngine(
            initial.spec,
            self.specs.parallel,
            self.specs.optim,
            value_head=self.role == "critic",
            seed=self.config.seed,
            share_prompts=self.section.share_prompts,
            lora=self.specs.lora,
        )
        self.engine.base_origin = base_origin(self.config)
        if initial.hf_state is not None:
            self.engine.load_hf_state_dict(initial.hf_state)
        if self.role == "actor" and self.mode == DISAGGREGATED:
            self._init_weight_source()  # rollout workers generate; this rank sends weights
        elif self.role == "actor" and self.mode == COLLOCATED:  # offline: nothing generates
            self.rollout = Rollout(self.engine, self.config, initial, self.size)
        del initial
        if self._host is not None:
            self._offload()  # the actor's stages come first: this role waits on the host
        memory_window(self.device)  # the weight conversion's transients go back to the OS now

    def _build_embodied(self) -> None:
        """An embodied run's actor: the vision-language-action policy (random init; no
        checkpoint of this family exists) and this rank's share of the environments
        (mindrl/workers/embodied.py); generation is the policy's own forward."""
        self.spec = gpt_spec(self.config.model)
        self.engine = MegatronEngine(
            self.spec,
            self.specs.parallel,
            self.specs.optim,
            seed=self.config.seed,
            vla=vla_spec(self.config.model, self.config.algorithm.reward_level),
        )
        self.engine.base_origin = base_origin(self.config)
        dp_rank, dp_size = self.engine.data_parallel_rank(), self.engine.data_parallel_size()
        self.embodied = EmbodiedActor(
            self.config, self.engine, dp_rank, dp_size, self.rank, self.dock
        )

    def embodied_rollout(self, iteration: int) -> dict:
        """One episode in each of this rank's environments, its chunk steps put into the
        dock; the episodes' sums (TP peers step the same environments: only DP leaders
        count)."""
        start = time.perf_counter()
        sums = self.embodied.rollout(iteration, self.algorithm, self.options)
        leader = self.engine.is_data_leader()
        return {**(sums if leader else {}), **self._timing(start)}

    def embodied_clone(self, first: int, count: int, total: int) -> dict:
        """Steps ``first .. first + count - 1`` of the behaviour-cloned start's ``total``
        DAgger steps from the environment's scripted expert (``env.clone_steps``)."""
        start = time.perf_counter()
        metrics = self.embodied.clone_expert(first, count, total)
        self.engine.release_gradients()
        return {**metrics, **self._timing(start)}

    def embodied_update(
        self, indexes: np.ndarray, num_minibatches: int, options: AlgorithmConfig | None = None
    ) -> dict:
        """The update on the chunk steps ``indexes`` (this DP rank's share of the last
        rollout's)."""
        start = time.perf_counter()
        self.options = options if options is not None else self.options
        metrics = self.embodied.update(
            indexes,
            self.algorithm,
            self.options,
            self.section.ppo_epochs,
            num_minibatches,
            self.section.micro_batch_size,
        )
        self.engine.release_gradients()
        return {**metrics, **self._timing(start)}

    # ---- generation (actor) --------------------------------------------------------------
    def generate(
        self, indexes: np.ndarray, params: SamplingParams, partial: PartialRollout | None = None
    ) -> dict:
        """Reshard, then sample one response per index into the dock (``partial``: at most
        its budget of new tokens each, mindrl/workers/generation.py)."""
        start = time.perf_counter()
        self.rollout.refresh_weights(reshard=partial is None or not partial.weights_loaded)
        leader = self.rank % self.config.rollout.tp == 0  # TP peers sampled the same responses
        if self.episodes is not None:  # multi-turn: an environment answers each turn
            report = run_episodes_into_dock(
                self.dock, self.rollout.generate, self.episodes.workers, indexes, params,
                self.episodes.settings, self.episodes.codec, put=leader,
            )  # fmt: skip
        else:
            report = generate_into_dock(
                self.dock,
                self.rollout.generate,
                indexes,
                params,
                self.config.data.n_samples_per_prompt,
                put=leader,
                partial=partial,
            )
        self.rollout.restore_training_state()
        return {
            **report,
            "reshard_s": self.rollout.seconds["reshard"],
            "swap_in_s": self.rollout.seconds.get("swap_in", 0.0),
            # Validation's hand-overs since the last rollout included.
            "handover_bytes": float(self.rollout.take_handover_bytes()),
            **self._timing(start),
        }

    def attach_env_workers(self, workers: list[ActorHandle]) -> None:
        """Run episodes with these environment workers from now on (a run with ``env``)."""
        self.episodes = EpisodeContext(
            workers,
            EnvSettings.of(self.config),
            TextCodec(load_tokenizer(self.config.model.tokenizer), self.config.data.chat_template),
        )

    def generate_held_out(
        self, prompts: list[list[int]], params: SamplingParams
    ) -> list[list[int]]:
        """Validation: ``params.n`` responses per prompt (prompt-major) with the current
        weights, returned to the driver, never put into the dock, so never trained on.

        Every actor rank calls it (the reshard is a collective); ``params.seed`` is the
        validation's own, and the engines seed sampling per call without touching the
        process's RNG, so training's sampling does not move.
        """
        self.rollout.refresh_weights()
        results = self.rollout.generate(prompts, params) if prompts else []
        self.rollout.restore_training_state()
        memory_window(self.device)  # its transients are not the next stage's peak
        return [list(r.token_ids) for r in results]

    def _timing(self, start: float) -> dict[str, float]:
        return stage_report(start, self.dock, self.device)

    def _offload(self) -> None:
        """Park this role's weights, grads and optimizer state in pinned host memory and
        give the device memory back for the other processes on the device."""
        params = list(self.engine.named_parameters().values())
        state = [*params, *grad_tensors(params), *self.engine.optimizer_state_tensors()]
        self._host.swap_out(state)
        self.device.empty_cache()

    # ---- scoring ----------------------------------------------------------------------------
    @on_device
    def score(self, indexes: np.ndarray, stage: str) -> dict[str, float]:
        """Stage ``stage`` (``old_logp``, ``ref_logp`` or ``values``) for ``indexes``: put
        the one field it writes (log-probs, or the critic's values)."""
        start = time.perf_counter()
        (field,) = self.context.stage(stage).writes
        rows = self._rows(indexes, stage)
        # A LoRA actor scores the reference as its frozen base (run_plan.reference_role).
        base = stage == REFERENCE_STAGE and self.role == "actor"
        with self.engine.adapters_off() if base else contextlib.nullcontext():
            outputs = self.engine.forward(rows, micro_batching(self.section))
        result = outputs["values" if self.role == "critic" else "logprobs"]
        if self.engine.is_data_leader():
            self.dock.put(indexes, {field: result, f"{field}_lengths": rows.response_len})
        return self._timing(start)

    def _rows(self, indexes: np.ndarray, stage: str) -> ResponseBatch:
        """Packed prompt + response rows of what ``stage`` reads, its other fields
        response-aligned; a multi-turn trajectory's mask is 0 on its observations, so no
        loss counts them."""
        fields = self.context.response_fields(stage)
        data = self.dock.fetch(indexes, [*self.context.sequence, *fields])
        lengths = data["response_ids_lengths"]
        packed = pack_rows(
            data["prompt_ids"], data["prompt_ids_lengths"], data["response_ids"], lengths
        )
        width = data["response_ids"].shape[1]
        # A TensorDict refuses `in` itself: its keys answer it.
        trajectory = data[LOSS_MASK] if LOSS_MASK in data.keys() else None  # noqa: SIM118
        return ResponseBatch(
            packed["input_ids"],
            packed["response_start"],
            loss_mask(lengths, width, trajectory),
            {name: data[name][:, :width].float().clone() for name in fields},
            response_lengths=lengths.long(),
        )

    # ---- training -----------------------------------------------------------------------------
    @on_device
    def update(
        self,
        indexes: np.ndarray,
        stage: str,
        num_minibatches: int,
        options: AlgorithmConfig | None = None,
    ) -> dict:
        """Training stage ``stage`` on ``indexes`` (this DP rank's share): epochs x
        mini-batches of steps on what the stage reads.

        ``options`` replaces the algorithm options when given (an adapted KL coefficient).
        """
        start = time.perf_counter()
        self.options = options if options is not None else self.options
        rows = self._rows(indexes, stage)
        step = critic_update if self.role == "critic" else actor_update
        metrics = step(self, rows, num_minibatches)
        self.engine.release_gradients()  # not swapped or kept through generation
        return {**metrics, **self._timing(start)}

    # ---- checkpoints ----------------------------------------------------------------------------
    @on_device
    def save_checkpoint(
        self,
        root: str,
        data_position: dict,
        in_flight: list[DockSlice] | None = None,
        background: bool = False,
    ) -> dict:
        """Save this role under ``root``; ``in_flight``: samples still in the dock that a
        later iteration trains, which rank 0 fetches and writes into the same step folder
        (published atomically with the weights: the driver never carries payloads).
        ``background``: return once this rank's part is copied to host memory; it is
        written while training goes on (the next save, or a load, waits for it).

        Returns ``step_dir`` (None when this save failed) and ``failed``: (step folder
        name, one line) per save that could not be written (the previous background one,
        this one), the same on every rank; the driver decides whether the run goes on
        (``checkpoint.on_error``).
        """
        failed = []
        try:
            self.engine.finish_checkpoint()
        except checkpoint.CheckpointWriteError as exc:
            failed.append((exc.step_dir.name, str(exc)))
        extra = None
        if in_flight and self.rank == 0:
            extra = {IN_FLIGHT: snapshot_samples(self.dock, in_flight)}
            self.dock.take_seconds()  # not the next stage's dock time
        try:
            step_dir = self.engine.save_checkpoint(
                Path(root) / self.role, data_position, extra, background
            )
        except checkpoint.CheckpointWriteError as exc:
            failed.append((exc.step_dir.name, str(exc)))
            step_dir = None
        return {"step_dir": str(step_dir) if step_dir else None, "failed": failed}

    @on_device
    def load_checkpoint(self, step_dir: str) -> dict:
        """Resume this role from one checked step folder (the driver picks it); rank 0
        puts the samples the checkpoint kept in flight back into the dock, at their
        indexes and with their weight versions."""
        position = self.engine.load_checkpoint(step_dir)
        saved = Path(step_dir) / IN_FLIGHT
        if self.rank == 0 and saved.with_suffix(".json").exists():
            restore_samples(self.dock, checkpoint.load_tree(saved))
            self.dock.take_seconds()
        return position
