"""The generation engine's working memory on one device: what it allocates to generate,
beyond its weights.

* vLLM allocates its KV cache up front (``rollout.kv_cache_mib``, else what
  ``rollout.memory_fraction`` of the device leaves) and holds it from wake-up to sleep.
* The transformers engine (``backends/generation/hf_engine.py``) allocates as it goes.
  Its continuous loop (``backends/generation/hf_slots.py``) holds every slot's KV cache
  over the longest live context and each step's logits, keeping none of them.
  ``generate``:
  a batch of ``rows`` sequences (the engine sizes it with the same arithmetic,
  ``backends/generation_memory.py``, capped by the samples a rank hands it per call,
  ``mindrl/workers/chunks.py``) ends holding its KV cache over the whole context and the
  raw float32 logits of every step; beside them, at the last step, the step's logits in
  the model's dtype, their float32 copy and the sampling probabilities, the step's
  activations, and while the cache grows one layer's keys (or values) twice. Every prompt
  and response is planned at its longest.
"""

from __future__ import annotations

from backends.generation.base import GenerationEngine
from backends.generation.registry import engine_class, engine_name
from backends.generation_memory import (
    LOGIT_BYTES,
    kv_bytes_per_token,
    prompts_per_call,
    sequence_bytes,
)
from mindrl.config import MindRLConfig
from mindrl.config.layout import DISAGGREGATED, placement_mode, training_devices
from mindrl.planner.params import DTYPE_BYTES
from mindrl.workers.chunks import chunk_samples

MIB = 2**20


def planned_engine(config: MindRLConfig) -> type[GenerationEngine]:
    """The engine class a run of ``config`` builds here (``auto``: vLLM where installed)."""
    return engine_class(engine_name(config.rollout.engine))


def samples_per_rank(config: MindRLConfig) -> int:
    """Samples one generation rank samples per iteration (its generation-DP share)."""
    disaggregated = placement_mode(config) == DISAGGREGATED
    world = config.rollout.devices if disaggregated else training_devices(config)
    gen_dp = max(world // config.rollout.tp, 1)
    total = config.data.global_batch_size * config.data.n_samples_per_prompt
    return -(-total // gen_dp)


def hf_rows_per_batch(config: MindRLConfig, budget: int) -> int:
    """Sequences in one ``generate`` batch of the transformers engine: its budget's worth,
    at most one call's samples."""
    model, rollout = config.model, config.rollout
    max_len = rollout.max_prompt_length + rollout.max_response_length
    per_token = kv_bytes_per_token(
        model.num_layers, model.num_kv_heads, model.head_dim, DTYPE_BYTES[model.dtype]
    )
    per_sequence = sequence_bytes(max_len, rollout.max_response_length, per_token, model.vocab_size)
    call = min(chunk_samples(config.data.n_samples_per_prompt), samples_per_rank(config))
    return min(call, prompts_per_call(budget, per_sequence, 1))


def hf_working_bytes(config: MindRLConfig, rows: int, keeps_logits: bool = True) -> int:
    """What ``rows`` sequences hold at the last step (see the module docstring): the KV
    cache of every position but the last sampled token's, the kept logits (``generate``
    keeps every step's; the continuous loop takes each step's log-probs and drops them),
    half a layer's cache twice while it grows, the step's logits and probabilities, and
    the step's activations."""
    model, rollout = config.model, config.rollout
    dtype = DTYPE_BYTES[model.dtype]
    cached = rollout.max_prompt_length + rollout.max_response_length - 1
    per_token = kv_bytes_per_token(model.num_layers, model.num_kv_heads, model.head_dim, dtype)
    kv = rows * cached * per_token
    logits = rows * rollout.max_response_length * model.vocab_size * LOGIT_BYTES * keeps_logits
    growing = kv // (2 * model.num_layers)  # one layer's keys (or values) old and new
    step_logits = rows * model.vocab_size * (dtype + 2 * LOGIT_BYTES)
    projections = (model.num_attention_heads + 2 * model.num_kv_heads) * model.head_dim
    step = rows * (4 * model.hidden_size + 3 * model.ffn_hidden_size + projections) * dtype
    return kv + logits + growing + step_logits + step


def generation_working_bytes(
    config: MindRLConfig, device_bytes: int, shard: int, kv_budget: int
) -> int:
    """The engine's working memory on one device; ``kv_budget``: what the memory fraction
    leaves for a KV cache when ``rollout.kv_cache_mib`` is not set."""
    rollout = config.rollout
    configured = None if rollout.kv_cache_mib is None else int(rollout.kv_cache_mib * MIB)
    if planned_engine(config).preallocates_kv_cache:
        return configured if configured is not None else max(kv_budget, 0)
    if rollout.continuous:  # every slot live at once, whatever the budget
        return hf_working_bytes(config, continuous_slots(config), keeps_logits=False)
    # The hf engine's own budget: the configured cache, else the fraction less its weights.
    budget = rollout.memory_fraction * device_bytes - shard if configured is None else configured
    return hf_working_bytes(config, hf_rows_per_batch(config, int(budget)))


def continuous_slots(config: MindRLConfig) -> int:
    """Sequences a rollout worker decodes at once in continuous generation (the runner
    starts its workers with this): ``rollout.continuous_slots``, else one batch's samples
    over the rollout workers."""
    return config.rollout.continuous_slots or samples_per_rank(config)
