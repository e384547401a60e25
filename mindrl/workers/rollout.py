"""The generation side of the actor: a generation engine fed by the resharder.

Collocated with the training engine on the same devices (paper, "Allgather–Swap"):
after each update :meth:`Rollout.refresh_weights` all-gathers the training shards into
the generation layout, hands them to the engine under HF names and swaps the training
state to the host; :meth:`Rollout.restore_training_state` brings it back before any
stage needs the training engine again.

With generation TP > 1 each rank hands the engine only its own shard of every TP-split
tensor, named as HF names the slices of the full tensors (the family's conversion runs
on a shard as on a model with 1/tp of the heads); vocabulary tensors stay whole
(``GenLayout.whole_vocab``), as the engines' ``load_weights`` expects.

A LoRA actor hands its frozen base over once (again only when the base itself was
loaded anew: ``MegatronEngine.base_version``) and, at every hand-over, its adapters: a
second resharder gathers them whole (they are tiny) and the engine merges them into the
base it keeps (``GenerationEngine.apply_adapters``; docs/architecture.md §13).
"""

from __future__ import annotations

import dataclasses
import time

import torch

from backends.generation import (
    EngineConfig,
    GenerationEngine,
    GenerationResult,
    SamplingParams,
    get_engine_class,
)
from backends.generation.registry import engine_name
from backends.megatron import GPTSpec, MegatronEngine
from backends.megatron.families import get_family
from mindrl.config.schema import MindRLConfig
from mindrl.reshard import (
    AllgatherSwapResharder,
    GenLayout,
    ModelShape,
    NaiveResharder,
    TrainLayout,
    grad_tensors,
)
from mindrl.workers.model_setup import InitialModel, pretrained_config


def generation_shard_spec(spec: GPTSpec, tp: int) -> GPTSpec:
    """The spec whose full tensors are one generation rank's TP shards.

    A shard of Megatron's fused qkv holds whole query groups, so splitting it into
    q / k / v is the full-model split with ``1/tp`` of the heads and groups.
    """
    if tp == 1:
        return spec
    return dataclasses.replace(
        spec,
        num_attention_heads=spec.num_attention_heads // tp,
        num_query_groups=spec.num_query_groups // tp,
        head_dim=spec.head_dim,
    )


def _mib_to_bytes(mib: float | None) -> int | None:
    return None if mib is None else int(mib * 2**20)


def make_generation_engine(config: MindRLConfig, initial: InitialModel) -> GenerationEngine:
    """The configured generation engine for the model, with no weights yet (with
    ``actor.lora``: one that takes the policy as a base and adapters)."""
    return get_engine_class(engine_name(config.rollout.engine))(
        EngineConfig(
            model=pretrained_config(initial.hf_config),
            max_model_len=config.rollout.max_prompt_length + config.rollout.max_response_length,
            dtype=initial.spec.torch_dtype,
            memory_fraction=config.rollout.memory_fraction,
            kv_cache_bytes=_mib_to_bytes(config.rollout.kv_cache_mib),
            tensor_parallel_size=config.rollout.tp,
            expert_parallel=config.rollout.ep > 1,
            expert_parallel_size=config.rollout.ep,
            enforce_eager=True,
            seed=config.seed,
            takes_adapters=config.actor.lora.enabled,
        )
    )


def make_resharder(
    trainer: MegatronEngine,
    spec: GPTSpec,
    config: MindRLConfig,
    world: int,
    swap: bool,
    whole: bool = False,
) -> NaiveResharder | AllgatherSwapResharder:
    """Training layout of ``world`` ranks -> generation layout (``rollout.tp``, or whole
    tensors with ``whole``) over the same ranks; with ``swap`` the training state goes to
    the host while generating."""
    train, gen, kwargs = _reshard_layouts(spec, config, world, whole)
    params = trainer.policy_weights()  # with LoRA: the frozen base (adapters on their own)
    layouts = trainer.policy_layouts()
    if not swap:
        return NaiveResharder(params, layouts, train, gen, **kwargs)
    extra = None
    if config.actor.swap_optimizer and trainer.optimizer is not None:

        def extra():
            # The engine lists its optimizer's state: torch AdamW's moments, or the
            # distributed optimizer's moment shards and fp32 main weights. Grads of a
            # released step (DDP buffers resized to 0) have no bytes and are skipped.
            return grad_tensors(params.values()) + trainer.optimizer_state_tensors()

    return AllgatherSwapResharder(params, layouts, train, gen, swap_extra=extra, **kwargs)


def make_adapter_resharder(
    trainer: MegatronEngine, spec: GPTSpec, config: MindRLConfig, world: int
) -> NaiveResharder:
    """The LoRA adapters' resharder: gathered whole on every rank (a few MiB; an engine
    holding a TP shard of a weight merges its own part), never swapped (they stay on the
    device beside generation)."""
    train, gen, kwargs = _reshard_layouts(spec, config, world, whole=True)
    return NaiveResharder(
        trainer.adapter_weights(), trainer.adapter_layouts(), train, gen, **kwargs
    )


def _reshard_layouts(
    spec: GPTSpec, config: MindRLConfig, world: int, whole: bool
) -> tuple[TrainLayout, GenLayout, dict]:
    """The training and generation layouts of a resharder, and its other arguments."""
    parallel = config.actor.parallel
    train = TrainLayout(world, parallel.tp, parallel.pp, parallel.cp, parallel.ep, parallel.etp)
    tp, ep = (1, 1) if whole else (config.rollout.tp, config.rollout.ep)
    gen = GenLayout(world, tp, ep, whole_vocab=True)
    kwargs = {
        "model": ModelShape(spec.num_attention_heads, spec.num_query_groups, spec.num_experts),
        "bucket_bytes": int(config.rollout.reshard_bucket_mib * 2**20),
    }
    return train, gen, kwargs


def tensor_bytes(tensors: dict[str, torch.Tensor]) -> int:
    """Bytes of ``tensors`` (what a hand-over gives the generation engine)."""
    return sum(t.nbytes for t in tensors.values())


class Rollout:
    """Generation engine + resharder of one actor rank.

    Args:
        trainer: this rank's training engine (its weights are the source).
        config: the run's config (``rollout`` and ``actor`` sections are read).
        initial: the model's HF config (the engine is built from it, weights come later).
        world: ranks of the actor group (training and generation share them).
    """

    def __init__(
        self, trainer: MegatronEngine, config: MindRLConfig, initial: InitialModel, world: int
    ) -> None:
        self.trainer, self.spec = trainer, initial.spec
        self.family = get_family(initial.spec.family)
        self.swap = config.rollout.swap
        self.resharder = make_resharder(trainer, initial.spec, config, world, self.swap)
        self.adapter_resharder = (
            make_adapter_resharder(trainer, initial.spec, config, world)
            if trainer.lora is not None
            else None
        )
        #: The trainer's ``base_version`` the engine holds (None: no base handed yet).
        self.handed_base: int | None = None
        #: Bytes handed to the engine since :meth:`take_handover_bytes` last read them.
        self.handover_bytes = 0
        self.shard_spec = generation_shard_spec(initial.spec, config.rollout.tp)
        self.generator = make_generation_engine(config, initial)
        self.seconds: dict[str, float] = {}

    def refresh_weights(self, reshard: bool = True) -> None:
        """Training shards -> generation shards -> engine; training state to the host.

        ``reshard=False``: the engine already holds the trainer's current weights (a later
        generation round of the same iteration under partial rollout: no update ran
        since), so only the training state leaves the device. The engine slept at level 1
        in between, which keeps its weights.

        The engine wakes once the training state has left, its weights first and its KV
        cache (vLLM's, allocated up front) once the generation buffers are freed: woken
        whole before the reshard, it was on the device beside the training state, the
        buffers and a gathered bucket, the stage's peak (mindrl/planner, rollout_steps).
        """
        start = time.perf_counter()
        if reshard:
            self._hand_over_base()
            if self.adapter_resharder is not None:
                self._hand_over_adapters()
            self.generator.wake_up()
        else:
            if self.swap:
                self.resharder.swap_out()
            self.generator.wake_up()
        self.seconds = {"reshard": time.perf_counter() - start}

    def _hand_over_base(self) -> None:
        """The trainer's weights but its adapters to the engine, unless it holds them (a
        LoRA base it was handed already: then only the training state leaves)."""
        if self.adapter_resharder is not None and self.handed_base == self.trainer.base_version:
            if self.swap:
                self.resharder.swap_out()
            return
        buffers = self.resharder.reshard()
        self.generator.wake_weights()
        self.generator.load_weights(self.family.iter_hf(buffers, self.shard_spec))
        self.handover_bytes += tensor_bytes(buffers)
        self.handed_base = self.trainer.base_version
        # The engine copied every tensor into its own weights. Kept, the generation
        # buffers would be one more copy of the model held through generation and
        # training (docs/memory.md); re-made next time, they cost one allocation.
        del buffers

    def _hand_over_adapters(self) -> None:
        """The adapters, whole, under HF linear names, merged by the engine into its base."""
        adapters = self.adapter_resharder.reshard()
        self.generator.wake_weights()
        hf = self.family.lora_to_hf(adapters, self.spec)
        self.generator.apply_adapters(hf, self.trainer.lora.scale)
        self.handover_bytes += tensor_bytes(adapters)

    def take_handover_bytes(self) -> int:
        """Bytes handed to the engine since the last call (a record's ``handover_bytes``)."""
        taken, self.handover_bytes = self.handover_bytes, 0
        return taken

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationResult]:
        return self.generator.generate(prompts, params)

    def restore_training_state(self) -> None:
        """Training weights (+ grads, optimizer state) back on the device; engine asleep."""
        if not self.swap or not self.resharder.host.swapped_bytes:
            return
        start = time.perf_counter()
        self.generator.sleep(level=1)
        self.resharder.swap_in()
        self.seconds["swap_in"] = time.perf_counter() - start
