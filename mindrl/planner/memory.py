"""Per-device memory of the training and generation stages, naive vs allgather–swap.

Bytes are decimal (``GB`` = 1e9 B) as in the paper's memory figures. The model:

* training stage (busiest pipeline stage): weights in ``model.dtype``; gradients in
  fp32 (Megatron keeps fp32 main grads); Adam state of 12 B/param for 16-bit models
  (fp32 master + m + v) or 8 B/param for fp32 models, divided over DP (experts: EDP)
  with the distributed optimizer; activations ~ ``34 * s * b * h / tp`` bytes per layer
  and micro-batch (Korthikanti et al. with sequence parallelism, which the engine turns
  on whenever tp > 1; flash attention, so no ``s^2`` term), ``2 * s * b * h / tp`` with
  full recompute (``actor.activation_checkpointing``: only each layer's input is kept).
* other roles (reference, critic) are collocated on the same devices and, unless the fit
  check offloads them (mindrl/planner/offload.py: an offloaded role is left out of
  ``roles``), stay resident through every stage: the reference's weights, the critic's
  weights + grads + optimizer state, each under its own layout. They add to both stages.
* generation stage (PP = 1, generation TP/EP): the generation weight shard, the KV
  cache in what is left of ``rollout.memory_fraction`` of the device, plus whatever
  training state stays resident. Naive resharding keeps all training state; with
  allgather–swap weights (and grads + optimizer state when ``actor.swap_optimizer``)
  go to host, so nothing of it stays.
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

from mindrl.config import MindRLConfig, ModelConfig, ParallelConfig
from mindrl.config.layout import stage_layer_counts, training_devices, training_layout
from mindrl.planner.params import DTYPE_BYTES, ParamCounts, model_params, stage_params

GRAD_BYTES = 4
ACTIVATION_FACTOR = 34
RECOMPUTE_FACTOR = 2


@dataclass(frozen=True)
class TrainingMemory:
    weights: int
    grads: int
    optimizer: int
    activations: int

    @property
    def total(self) -> int:
        return self.weights + self.grads + self.optimizer + self.activations


@dataclass(frozen=True)
class GenerationMemory:
    shard: int
    resident_training: int
    kv_cache_budget: int
    kv_bytes_per_token: int

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

    @property
    def training_stage_total(self) -> int:
        """The actor's update plus the other roles' resident state."""
        return self.training.total + sum(self.other_roles.values())

    def as_dict(self) -> dict:
        out = asdict(self)
        out["training"]["total"] = self.training.total
        out["training_stage_total"] = self.training_stage_total
        return out


def shard_counts(counts: ParamCounts, tp: int, ep: int, etp: int = 1) -> float:
    """Elements of ``counts`` one device holds under tensor/expert parallelism."""
    return counts.tp / tp + counts.expert / (ep * etp) + counts.replicated


def busiest_stage(model: ModelConfig, parallel: ParallelConfig) -> ParamCounts:
    stages = stage_params(model, stage_layer_counts(parallel, model.num_layers))
    return max(stages, key=lambda c: shard_counts(c, parallel.tp, parallel.ep, parallel.etp))


def training_memory(config: MindRLConfig, role_name: str = "actor") -> TrainingMemory:
    model, role = config.model, getattr(config, role_name)
    parallel = role.parallel
    dtype_bytes = DTYPE_BYTES[model.dtype]
    stage = busiest_stage(model, parallel)
    local = shard_counts(stage, parallel.tp, parallel.ep, parallel.etp)
    optim_bytes = 12 if dtype_bytes == 2 else 8
    dense = stage.tp / parallel.tp + stage.replicated
    experts = stage.expert / (parallel.ep * parallel.etp)
    if role.optim.distributed_optimizer:
        layout = training_layout(role, model, training_devices(config))
        dense /= max(layout.dp, 1)
        experts /= max(layout.edp, 1)
    return TrainingMemory(
        weights=int(local * dtype_bytes),
        grads=int(local * GRAD_BYTES),
        optimizer=int((dense + experts) * optim_bytes),
        activations=activation_bytes(config, role_name),
    )


def resident_bytes(config: MindRLConfig, role_name: str) -> int:
    """What a collocated role keeps on the device outside its own compute: the reference
    its weights, a trained role (critic) its weights, grads and optimizer state."""
    memory = training_memory(config, role_name)
    if role_name == "reference":
        return memory.weights
    return memory.weights + memory.grads + memory.optimizer


def activation_bytes(config: MindRLConfig, role_name: str = "actor") -> int:
    model, role = config.model, getattr(config, role_name)
    parallel = role.parallel
    seq = (config.rollout.max_prompt_length + config.rollout.max_response_length) // parallel.cp
    layers = max(stage_layer_counts(parallel, model.num_layers))
    factor = RECOMPUTE_FACTOR if role.activation_checkpointing else ACTIVATION_FACTOR
    factor /= parallel.tp  # sequence parallelism splits what is kept over TP
    return int(factor * seq * role.micro_batch_size * model.hidden_size * layers)


def kv_bytes_per_token(model: ModelConfig, gen_tp: int) -> int:
    dtype_bytes = DTYPE_BYTES[model.dtype]
    if model.uses_mla:  # compressed latent + rope key, not split by TP
        return model.num_layers * (model.kv_lora_rank + model.qk_rope_head_dim) * dtype_bytes
    kv_heads = max(model.num_kv_heads // gen_tp, 1)
    return 2 * model.num_layers * kv_heads * model.head_dim * dtype_bytes


def redundant_bytes(model: ModelConfig, train: ParallelConfig, gen_ep: int) -> int:
    """Generalised Eq. 3 for the busiest training stage (see module docstring)."""
    stage = busiest_stage(model, train)
    expert_train = stage.expert / (train.ep * train.etp)
    reusable = gen_ep % train.ep == 0 and train.etp == 1
    expert_redundant = expert_train - (model_params(model).expert / gen_ep if reusable else 0)
    return int((stage.tp / train.tp + max(expert_redundant, 0)) * DTYPE_BYTES[model.dtype])


def rollout_device_memory(config: MindRLConfig, device_bytes: int) -> GenerationMemory:
    """Disaggregated placement: a rollout device holds its generation weight shard and the
    KV cache, nothing of training (no swap needed, nothing resident)."""
    model, rollout = config.model, config.rollout
    shard = int(
        shard_counts(model_params(model), rollout.tp, rollout.ep) * DTYPE_BYTES[model.dtype]
    )
    budget = int(device_bytes * rollout.memory_fraction)
    return GenerationMemory(shard, 0, budget - shard, kv_bytes_per_token(model, rollout.tp))


def plan_memory(
    config: MindRLConfig,
    device_bytes: int,
    roles: tuple[str, ...] = ("actor",),
    generates: bool = True,
) -> MemoryPlan:
    """Per-device memory of both stages, with and without allgather–swap.

    ``roles``: the trainer's model roles; all but the actor are resident throughout.
    ``generates``: whether the run has a generation stage (``RunPlan.generates``);
    without one only the training stage is sized.
    """
    training = training_memory(config)
    others = {r: resident_bytes(config, r) for r in roles if r in ("reference", "critic")}
    if not generates:  # the rollout settings are not read: no engine, KV cache or swap
        return MemoryPlan(device_bytes, training, None, None, 0, 0, others)
    model, rollout = config.model, config.rollout
    shard = int(
        shard_counts(model_params(model), rollout.tp, rollout.ep) * DTYPE_BYTES[model.dtype]
    )
    swapped = training.weights + (
        training.grads + training.optimizer if config.actor.swap_optimizer else 0
    )
    resident_swap = training.weights + training.grads + training.optimizer - swapped
    resident_naive = training.weights + training.grads + training.optimizer
    budget = int(device_bytes * rollout.memory_fraction)
    per_token = kv_bytes_per_token(model, rollout.tp)

    def generation(actor_resident: int) -> GenerationMemory:
        resident = actor_resident + sum(others.values())
        return GenerationMemory(shard, resident, budget - shard - resident, per_token)

    return MemoryPlan(
        device_bytes=device_bytes,
        training=training,
        generation_naive=generation(resident_naive),
        generation_swap=generation(resident_swap),
        redundant_bytes=redundant_bytes(model, config.actor.parallel, rollout.ep),
        swap_bytes=swapped,
        other_roles=others,
    )
