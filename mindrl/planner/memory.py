"""Per-device memory of the training and generation stages, naive vs allgather–swap.

Bytes are decimal (``GB`` = 1e9 B) as in the paper's memory figures. The model, checked
stage by stage against a tensor-level tracker of the real engines (docs/memory.md,
``benchmarks/stage_memory.py``):

* training state (busiest pipeline stage): weights in ``model.dtype``. The default
  optimizer (torch AdamW, replicated over DP) keeps its two moments and the gradients in
  the weights' dtype, and its multi-tensor step one moment-sized temporary. Megatron's
  distributed optimizer keeps float32 gradients in its buffer and float32 main weights +
  moments (12 B/param for 16-bit models, 8 for fp32 ones whose main weights are the
  weights) divided over DP (experts: EDP), and its step a float32 temporary of its shard.
  Gradients exist only in the update: every role releases them after its step.
* the update's peak: the resident state, plus the larger of the micro-batches' backward
  (gradients + one micro-batch's activations, ``mindrl/planner/activations.py``) and
  the optimizer step (gradients + its temporaries).
* other roles (reference, critic) are collocated on the same devices and, unless the fit
  check offloads them (mindrl/planner/offload.py: an offloaded role is left out of
  ``roles``), stay resident through every stage: the reference's weights, the critic's
  weights + optimizer state, each under its own layout. They add to both stages.
* generation stage (PP = 1, generation TP/EP): the generation weight shard, the KV
  cache in what is left of ``rollout.memory_fraction`` of the device, plus whatever
  training state stays resident. Naive resharding keeps all training state; with
  allgather–swap weights (and optimizer state when ``actor.swap_optimizer``) go to host.
  The actor's rollout stage (:func:`rollout_steps`) peaks at one of its four steps:
  the reshard (the training state still resident, the generation buffers and one
  gathered bucket), the load (the engine's weights beside the buffers and what stays of
  the training state), generation (that, the engine's weights and its working memory: for
  the transformers engine its KV cache and kept logits,
  ``backends/generation_memory.py``; for vLLM its KV budget) or the swap-in (the
  training state back, the engine asleep on the host).
* redundant bytes (paper Eq. 3 generalised, docs/architecture.md §5): training weight
  bytes resident in the generation stage that the generation engine cannot reuse. Dense
  TP shards are never reused (generation gathers into new buffers): ``S_tp / T_u``.
  Experts are reused when each generation device's experts are a subset of its training
  experts (``E_g`` a multiple of ``EP_u`` and ``ETP_u`` = 1):
  ``S_ep / (EP_u*ETP_u) - S_ep / E_g``; otherwise all of ``S_ep / (EP_u*ETP_u)``. For the
  paper's case this is exactly
  ``S_tp/T_u + S_ep*(T_u/D_g - 1/E_g)``.
* a run that generates nothing (offline: DPO's stored pairs) has only the training
  stage: no generation stage, no redundant bytes and nothing swapped.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from backends.generation_memory import kv_bytes_per_token as kv_bytes_per_token_of
from mindrl.config import MindRLConfig, ModelConfig, ParallelConfig
from mindrl.config.layout import (
    DISAGGREGATED,
    placement_mode,
    rollout_worker_spans_devices,
    stage_layer_counts,
    training_devices,
    training_layout,
)
from mindrl.planner.activations import (
    F32,
    activation_bytes,
    micro_batch_shape,
    micro_batches_per_step,
)
from mindrl.planner.generation import generation_working_bytes, planned_engine
from mindrl.planner.params import (
    DTYPE_BYTES,
    ParamCounts,
    lora_stage_params,
    model_params,
    stage_params,
)

MIB = 2**20


@dataclass(frozen=True)
class TrainingMemory:
    """One trained (or scoring) role's device bytes on its busiest pipeline stage.

    ``activations``: one micro-batch's at its peak (times those a pipeline keeps in
    flight); ``step_temporaries``: what the optimizer step allocates beside the state;
    ``accumulates``: several micro-batches per step, so gradients exist while
    activations do.
    """

    weights: int
    grads: int
    optimizer: int
    activations: int
    step_temporaries: int = 0
    accumulates: bool = True
    #: tokens of the planned micro-batch, and the role's budget (None: micro_batch_size)
    micro_batch_tokens: int = 0
    max_tokens_per_micro_batch: int | None = None

    @property
    def resident(self) -> int:
        """Held between stages: gradients are released after every update."""
        return self.weights + self.optimizer

    @property
    def total(self) -> int:
        """The update's peak: the backward of a micro-batch, or the optimizer step."""
        backward = self.activations + (self.grads if self.accumulates else 0)
        return self.resident + max(backward, self.grads + self.step_temporaries)


@dataclass(frozen=True)
class RolloutSteps:
    """The actor's device bytes at each step of its rollout stage (one worker's own)."""

    reshard: int
    load: int
    generate: int
    swap_in: int

    @property
    def peak(self) -> int:
        return max(self.reshard, self.load, self.generate, self.swap_in)


@dataclass(frozen=True)
class GenerationMemory:
    """The generation stage of a device: its engine's weight shard, the training state
    the roles keep resident, the KV budget the memory fraction leaves, and the engine's
    working memory as it generates (``working``: KV cache, kept logits)."""

    shard: int
    resident_training: int
    kv_cache_budget: int
    kv_bytes_per_token: int
    working: int = 0

    @property
    def total_without_kv(self) -> int:
        return self.shard + self.resident_training

    @property
    def kv_tokens(self) -> int:
        return max(self.kv_cache_budget, 0) // max(self.kv_bytes_per_token, 1)


@dataclass(frozen=True)
class MemoryPlan:
    device_bytes: int
    training: TrainingMemory
    generation_naive: GenerationMemory | None  # None: the run generates nothing
    generation_swap: GenerationMemory | None
    redundant_bytes: int
    swap_bytes: int
    other_roles: dict[str, int] = field(default_factory=dict)
    rollout: RolloutSteps | None = None  # the actor's rollout stage, step by step
    #: The generation engine's bytes still on the device in the update: without the swap
    #: nothing puts it to sleep (``Rollout.restore_training_state``).
    engine_in_update: int = 0
    #: What each worker process's math libraries keep on the device
    #: (``Device.library_workspace_bytes``), counted once per process.
    workspace: int = 0

    @property
    def update_stage(self) -> int:
        """The actor worker's update peak: its training state, its engine, its libraries'
        workspace."""
        return self.training.total + self.engine_in_update + self.workspace

    @property
    def rollout_peak(self) -> int:
        """The actor worker's rollout peak: its steps' largest, and its workspace."""
        return (self.rollout.peak + self.workspace) if self.rollout else 0

    @property
    def training_stage_total(self) -> int:
        """The actor's update plus the other roles' resident state."""
        return self.update_stage + sum(self.other_roles.values())

    @property
    def rollout_stage_total(self) -> int:
        """The actor's rollout peak plus the other roles' resident state."""
        return self.rollout_peak + sum(self.other_roles.values())

    def as_dict(self) -> dict:
        out = asdict(self)
        out["training"]["total"] = self.training.total
        out["training"]["resident"] = self.training.resident
        out["update_stage"] = self.update_stage
        out["training_stage_total"] = self.training_stage_total
        if self.rollout is not None:
            out["rollout"]["peak"] = self.rollout_peak
            out["rollout_stage_total"] = self.rollout_stage_total
        return out


def shard_counts(counts: ParamCounts, tp: int, ep: int, etp: int = 1) -> float:
    """Elements of ``counts`` one device holds under tensor/expert parallelism."""
    return counts.tp / tp + counts.expert / (ep * etp) + counts.replicated


def busiest_stage(model: ModelConfig, parallel: ParallelConfig) -> ParamCounts:
    stages = stage_params(model, _layers(model, parallel))
    return stages[_busiest(stages, parallel)]


def _layers(model: ModelConfig, parallel: ParallelConfig) -> list[int]:
    return stage_layer_counts(parallel, model.num_layers)


def _busiest(stages: list[ParamCounts], parallel: ParallelConfig) -> int:
    """The pipeline stage whose device holds the most parameters."""
    local = [shard_counts(c, parallel.tp, parallel.ep, parallel.etp) for c in stages]
    return local.index(max(local))


def trained_counts(config: MindRLConfig, role_name: str) -> ParamCounts:
    """What the role's optimizer trains on its busiest stage: every weight, or with LoRA
    the adapters alone (the base is frozen: no gradients, no optimizer state)."""
    model, role = config.model, getattr(config, role_name)
    layers = _layers(model, role.parallel)
    stages = stage_params(model, layers)
    busiest = _busiest(stages, role.parallel)
    if role_name == "actor" and role.lora.enabled:
        return lora_stage_params(model, role.lora, layers)[busiest]
    return stages[busiest]


def training_memory(config: MindRLConfig, role_name: str = "actor") -> TrainingMemory:
    model, role = config.model, getattr(config, role_name)
    parallel = role.parallel
    dtype_bytes = DTYPE_BYTES[model.dtype]
    local = shard_counts(busiest_stage(model, parallel), parallel.tp, parallel.ep, parallel.etp)
    trained = trained_counts(config, role_name)
    trainable = shard_counts(trained, parallel.tp, parallel.ep, parallel.etp)
    adapters = trainable if role_name == "actor" and role.lora.enabled else 0
    trains = role_name != "reference"
    if role.optim.distributed_optimizer:
        layout = training_layout(role, model, training_devices(config))
        dense = (trained.tp / parallel.tp + trained.replicated) / max(layout.dp, 1)
        experts = trained.expert / (parallel.ep * parallel.etp) / max(layout.edp, 1)
        shard = dense + experts
        grads = trainable * F32  # Megatron DDP's float32 gradient buffer
        optimizer = shard * (12 if dtype_bytes < F32 else 8)  # main weights + moments
        step = shard * F32
    else:  # torch AdamW: moments and grads in the weights' dtype
        grads = trainable * dtype_bytes
        optimizer, step = 2 * trainable * dtype_bytes, trainable * dtype_bytes
    if not trains:
        grads = optimizer = step = 0
    return TrainingMemory(
        weights=int((local + adapters) * dtype_bytes),
        grads=int(grads),
        optimizer=int(optimizer),
        activations=activation_bytes(config, role_name) if trains else 0,
        step_temporaries=int(step),
        accumulates=micro_batches_per_step(config, role) > 1,
        micro_batch_tokens=micro_batch_shape(config, role).tokens,
        max_tokens_per_micro_batch=role.max_tokens_per_micro_batch,
    )


def resident_bytes(config: MindRLConfig, role_name: str) -> int:
    """What a collocated role keeps on the device outside its own compute: the reference
    its weights, a trained role (critic) its weights and optimizer state (gradients are
    released after each update)."""
    return training_memory(config, role_name).resident


def kv_bytes_per_token(model: ModelConfig, gen_tp: int) -> int:
    dtype_bytes = DTYPE_BYTES[model.dtype]
    if model.uses_mla:  # compressed latent + rope key, not split by TP
        return model.num_layers * (model.kv_lora_rank + model.qk_rope_head_dim) * dtype_bytes
    kv_heads = max(model.num_kv_heads // gen_tp, 1)
    return kv_bytes_per_token_of(model.num_layers, kv_heads, model.head_dim, dtype_bytes)


def redundant_bytes(model: ModelConfig, train: ParallelConfig, gen_ep: int) -> int:
    """Generalised Eq. 3 for the busiest training stage (see module docstring)."""
    stage = busiest_stage(model, train)
    expert_train = stage.expert / (train.ep * train.etp)
    reusable = gen_ep % train.ep == 0 and train.etp == 1
    expert_redundant = expert_train - (model_params(model).expert / gen_ep if reusable else 0)
    return int((stage.tp / train.tp + max(expert_redundant, 0)) * DTYPE_BYTES[model.dtype])


def generation_shard_bytes(config: MindRLConfig) -> int:
    """One generation rank's weights (generation TP / EP)."""
    model, rollout = config.model, config.rollout
    counts = shard_counts(model_params(model), rollout.tp, rollout.ep)
    return int(counts * DTYPE_BYTES[model.dtype])


def rollout_device_memory(config: MindRLConfig, device_bytes: int) -> GenerationMemory:
    """Disaggregated placement: a rollout device holds its generation weight shard and the
    KV cache, nothing of training (no swap needed, nothing resident)."""
    model, rollout = config.model, config.rollout
    shard = generation_shard_bytes(config)
    budget = int(device_bytes * rollout.memory_fraction)
    working = generation_working_bytes(config, device_bytes, shard, budget - shard)
    return GenerationMemory(
        shard, 0, budget - shard, kv_bytes_per_token(model, rollout.tp), working
    )


def rollout_worker_peak(config: MindRLConfig, device_bytes: int) -> int:
    """A disaggregated rollout worker's peak on a device of its own: the engine's weights,
    the next weights it receives (at ``rollout.tp: 1`` a whole copy:
    ``RolloutWorker.receive_weights`` broadcasts every tensor into a new buffer, then the
    engine copies them in; a TP group's worker receives into the host, one tensor at a
    time through the device) and the engine's working memory. The continuous loop
    decodes beside the received copy until its next step loads it, and an engine that
    preallocates its KV cache (vLLM) holds it while it receives, so all three add up;
    otherwise the weights arrive between two generations."""
    rollout = rollout_device_memory(config, device_bytes)
    spans = rollout_worker_spans_devices(config)
    received = largest_tensor_bytes(config.model) if spans else rollout.shard
    if config.rollout.continuous or planned_engine(config).preallocates_kv_cache:
        return rollout.shard + received + rollout.working
    return rollout.shard + max(received, rollout.working)


def largest_tensor_bytes(model: ModelConfig) -> int:
    """The largest HF tensor of ``model``: the embedding (or output) matrix, or an MLP
    one."""
    largest = max(model.vocab_size, model.ffn_hidden_size) * model.hidden_size
    return largest * DTYPE_BYTES[model.dtype]


def rollout_device_peak(config: MindRLConfig, memory: MemoryPlan) -> int:
    """A disaggregated rollout device's planned peak: its worker's
    (:func:`rollout_worker_peak`) and that process's math libraries' workspace."""
    return rollout_worker_peak(config, memory.device_bytes) + memory.workspace


def gather_bucket_bytes(config: MindRLConfig, training: TrainingMemory) -> int:
    """The all-gather buffers of one resharding bucket: the gathered one,
    ``rollout.reshard_bucket_mib`` at most and no more than the TP-gathered weights of a
    smaller model, and under TP this rank's part of it packed for sending (the
    resharder gathers bucket by bucket and frees each before the next, mindrl/reshard)."""
    tp = config.actor.parallel.tp
    gathered = min(int(config.rollout.reshard_bucket_mib * MIB), training.weights * tp)
    return gathered + (gathered // tp if tp > 1 else 0)


def rollout_steps(
    config: MindRLConfig, training: TrainingMemory, shard: int, working: int
) -> RolloutSteps:
    """The actor's rollout stage on one device, step by step (see the module docstring).

    The reshard gathers into the generation buffers (one shard) beside the training
    state, which then leaves (allgather-swap); the engine's weights wake and load the
    buffers, which are freed before its KV cache wakes (``Rollout.refresh_weights``); it
    generates; it sleeps, to the host, before the training state comes back.
    """
    buffers = shard
    reshard = training.resident + buffers + gather_bucket_bytes(config, training)
    if not config.rollout.swap:  # nothing put the engine to sleep after the last rollout
        reshard += shard
    if not config.rollout.swap:
        stays = training.resident
    else:
        stays = 0 if config.actor.swap_optimizer else training.optimizer
    swap_in = training.resident if config.rollout.swap else 0
    return RolloutSteps(reshard, stays + buffers + shard, stays + shard + working, swap_in)


def plan_memory(
    config: MindRLConfig,
    device_bytes: int,
    roles: tuple[str, ...] = ("actor",),
    generates: bool = True,
    workspace: int = 0,
) -> MemoryPlan:
    """Per-device memory of both stages, with and without allgather–swap.

    ``roles``: the trainer's model roles; all but the actor are resident throughout.
    ``generates``: whether the run has a generation stage (``RunPlan.generates``);
    without one only the training stage is sized. ``workspace``: what each worker
    process's math libraries keep on the device (``Device.library_workspace_bytes``):
    the actor's and each resident role's. An offloaded role's process keeps its own
    too, which is not counted (64 MiB on a GPU, below what the fit check decides on).
    """
    training = training_memory(config)
    others = {
        r: resident_bytes(config, r) + workspace for r in roles if r in ("reference", "critic")
    }
    if not generates:  # the rollout settings are not read: no engine, KV cache or swap
        return MemoryPlan(device_bytes, training, None, None, 0, 0, others, workspace=workspace)
    model, rollout = config.model, config.rollout
    disaggregated = placement_mode(config) == DISAGGREGATED  # the actor does not generate
    shard = generation_shard_bytes(config)
    swapped = training.weights + (training.optimizer if config.actor.swap_optimizer else 0)
    resident_naive = training.resident
    resident_swap = resident_naive - swapped
    budget = int(device_bytes * rollout.memory_fraction)
    per_token = kv_bytes_per_token(model, rollout.tp)
    kept = resident_swap if rollout.swap else resident_naive
    working = generation_working_bytes(
        config, device_bytes, shard, budget - shard - kept - sum(others.values())
    )

    def generation(actor_resident: int) -> GenerationMemory:
        resident = actor_resident + sum(others.values())
        return GenerationMemory(shard, resident, budget - shard - resident, per_token, working)

    return MemoryPlan(
        device_bytes=device_bytes,
        training=training,
        generation_naive=generation(resident_naive),
        generation_swap=generation(resident_swap),
        redundant_bytes=redundant_bytes(model, config.actor.parallel, rollout.ep),
        swap_bytes=swapped,
        other_roles=others,
        rollout=None if disaggregated else rollout_steps(config, training, shard, working),
        engine_in_update=engine_in_update(config, shard, working),
        workspace=workspace,
    )


def engine_in_update(config: MindRLConfig, shard: int, working: int) -> int:
    """What the collocated engine keeps on the device through the update: all it holds
    without the swap (an engine that preallocates its KV cache, vLLM, that too), nothing
    with it (asleep on the host)."""
    if config.rollout.swap or placement_mode(config) == DISAGGREGATED:
        return 0
    return shard + (working if planned_engine(config).preallocates_kv_cache else 0)
