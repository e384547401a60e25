"""What one micro-batch of the update keeps on the device, as the engine builds the model.

Counted from the tensors the engine's layers keep for backward (Megatron-core's local
layer spec with torch's fused attention, ``backends/megatron/attention.py``: the build
wherever TransformerEngine is absent), per token and layer, and checked against the
tensor-level tracker (``benchmarks/stage_memory.py``) on several shapes; docs/memory.md
lists them. In elements of the model's dtype unless said:

* norms and residuals: the two RMSNorm outputs and the two residual sums, ``4 h`` (plus
  each norm's float32 inverse RMS);
* attention: the fused q/k/v projection (``q + 2 kv``), the rotary outputs of q and k
  (``q + kv``) and the attention output (``q``), with ``q = heads * head_dim`` and
  ``kv = kv_heads * head_dim`` (grouped-query heads are not repeated): ``3 (q + kv)``,
  and the kernel's float32 log-sum-exp per head; no ``s^2`` scores, except that rows
  packed behind a shared prompt pass a dense mask, which each layer keeps as an additive
  ``[rows, s, s]`` one in the model's dtype;
* SwiGLU MLP: the fc1 output (``2 f``), the activation, the linear half's offset copy
  and their product (``3 f``): ``5 f``;
* outside the layers: the embedding output and the final norm (``2 h``), the hidden
  states gathered at the response positions and the logits there, which the loss turns
  into float32 log-probs (one copy) and, for the actor, entropy (two float32 copies and
  a mask).

Under tensor parallelism (with sequence parallelism) every per-token term is split over
TP; under context parallelism each CP rank runs ``1 / cp`` of a micro-batch's packed row
and scores the response tokens there, so tokens and logits divide by ``cp`` (the shared-
prompt mask stays the whole row's). With ``activation_checkpointing`` only each layer's
input is kept, and backward recomputes one layer at a time. On a pipeline of accelerators
Megatron's 1F1B schedule keeps up to ``pp`` micro-batches in flight on the first stage;
the CPU runs one.
"""

from __future__ import annotations

from dataclasses import dataclass

from mindrl.config import MindRLConfig, ModelConfig, RoleConfig
from mindrl.config.layout import stage_layer_counts, training_devices, training_layout
from mindrl.planner.params import DTYPE_BYTES

#: float32 bytes: log-probs, entropy and the softmax are computed in float32.
F32 = 4
#: Per logit kept for backward beyond the output layer's own (dtype): the float32
#: log-softmax copy; with entropy, its ``exp`` and ``z - max`` (float32) and a bool mask.
LOGPROB_LOGIT_BYTES = F32
ENTROPY_LOGIT_BYTES = 2 * F32 + 1


@dataclass(frozen=True)
class MicroBatchShape:
    """What one micro-batch runs: ``rows`` of ``seq`` tokens, and the response tokens
    whose logits it computes (``logit_positions``, over all its rows)."""

    rows: int
    seq: int
    logit_positions: int

    @property
    def tokens(self) -> int:
        return self.rows * self.seq


def shares_prompts(config: MindRLConfig, role: RoleConfig) -> bool:
    """Whether the plan counts a group's responses behind one copy of its prompt (the
    engine's packed micro-batches share it, ``backends/megatron/packing.py``). MLA is
    still planned unshared, every row at full length: an over-estimate, since its
    engine shares prompts too."""
    return role.share_prompts and not config.model.uses_mla


def samples_per_step(config: MindRLConfig, role: RoleConfig) -> int:
    """Samples one data-parallel rank trains on in one optimizer step (an embodied
    run's samples are its episodes' chunk steps)."""
    dp = max(training_layout(role, config.model, training_devices(config)).dp, 1)
    samples = config.data.global_batch_size * config.data.n_samples_per_prompt
    if config.env.embodied:
        samples *= config.env.horizon // config.env.chunk_size
    prompts_per_step = role.mini_batch_size or config.data.global_batch_size
    steps = max(-(-config.data.global_batch_size // prompts_per_step), 1)
    return max(samples // dp // steps, 1)


def micro_batch_shape(config: MindRLConfig, role: RoleConfig) -> MicroBatchShape:
    """The largest micro-batch: every prompt and response at its longest; with a token
    budget, one packed row of the budget's tokens (:func:`budget_shape`)."""
    if role.max_tokens_per_micro_batch is not None:
        return budget_shape(config, role, role.max_tokens_per_micro_batch)
    prompt, response = config.rollout.max_prompt_length, config.rollout.max_response_length
    rows = min(role.micro_batch_size, samples_per_step(config, role))
    if config.env.embodied:
        return chunk_step_shape(config, rows)
    n = config.data.n_samples_per_prompt
    if shares_prompts(config, role) and n > 1:
        per_row = min(n, rows)  # responses packed behind one prompt
        packed = -(-rows // per_row)
        return MicroBatchShape(packed, prompt + per_row * response, rows * response)
    return MicroBatchShape(rows, prompt + response, rows * response)


def chunk_step_shape(config: MindRLConfig, rows: int) -> MicroBatchShape:
    """``rows`` chunk steps of a vision-language-action policy: each row its image
    patches, keypoint tokens, the state token, the instruction (at most
    ``rollout.max_prompt_length`` words) and the chunk's action inputs but the last, the
    logits those of the chunk's action tokens (backends/megatron/families/vla.py)."""
    vla = config.model.vla
    actions = vla.chunk_size * vla.action_dims
    prefix = (vla.image_size // vla.patch_size) ** 2 + vla.keypoints + 1
    seq = prefix + config.rollout.max_prompt_length + actions - 1
    return MicroBatchShape(rows, seq, rows * actions)


def budget_shape(config: MindRLConfig, role: RoleConfig, budget: int) -> MicroBatchShape:
    """A token budget's micro-batch: one packed row of ``budget`` tokens (the engine
    fills it with whole sequences up to it), or of one longest sequence where that is
    longer, or of the whole step where that is shorter. Its response tokens, whose
    logits it computes, are in the proportion of its longest sequences'."""
    response = config.rollout.max_response_length
    longest = packed_tokens(config, role, 1)
    seq = min(max(budget, longest), packed_tokens(config, role, samples_per_step(config, role)))
    rows = 1
    while packed_tokens(config, role, rows + 1) <= seq:
        rows += 1
    return MicroBatchShape(1, seq, -(-seq * rows * response // packed_tokens(config, role, rows)))


def packed_tokens(config: MindRLConfig, role: RoleConfig, rows: int) -> int:
    """Tokens of ``rows`` of the longest sequences in one packed row: a group's prompt
    once where prompts are shared."""
    prompt, response = config.rollout.max_prompt_length, config.rollout.max_response_length
    n = config.data.n_samples_per_prompt
    per_prompt = n if shares_prompts(config, role) and n > 1 else 1
    return -(-rows // per_prompt) * prompt + rows * response


def per_context_parallel_rank(shape: MicroBatchShape, cp: int) -> MicroBatchShape:
    """What one of ``cp`` ranks runs of ``shape``: its share of the (packed) row and of
    the positions that score response tokens."""
    return MicroBatchShape(shape.rows, -(-shape.seq // cp), -(-shape.logit_positions // cp))


def micro_batches_per_step(config: MindRLConfig, role: RoleConfig) -> int:
    samples = samples_per_step(config, role)
    if role.max_tokens_per_micro_batch is None:
        return -(-samples // role.micro_batch_size)
    return -(-packed_tokens(config, role, samples) // micro_batch_shape(config, role).tokens)


def attention_elements(model: ModelConfig) -> int:
    """Elements the attention of one layer keeps per token (see the module docstring)."""
    if model.uses_mla:  # q, compressed kv and their up-projections, the output
        heads = model.num_attention_heads
        q = heads * (model.qk_nope_head_dim + model.qk_rope_head_dim)
        v = heads * model.v_head_dim
        return (model.q_lora_rank or 0) + model.kv_lora_rank + 3 * q + 2 * v
    return 3 * (model.num_attention_heads + model.num_kv_heads) * model.head_dim


def mlp_elements(model: ModelConfig, layer: int) -> int:
    """Elements one layer's MLP keeps per token: SwiGLU's ``5 f``; an MoE layer that for
    each of its top-k experts and its shared experts, plus the tokens it dispatches."""
    if not model.is_moe or layer < model.first_k_dense_layers:
        return 5 * model.ffn_hidden_size
    expert = model.moe_ffn_hidden_size or model.ffn_hidden_size
    routed = model.moe_router_topk * (5 * expert + 2 * model.hidden_size)
    return routed + 5 * model.num_shared_experts * expert + 2 * model.num_experts


def layer_bytes_per_token(
    model: ModelConfig, layer: int, seq: int, tp: int, packed: bool = False
) -> float:
    """Bytes one layer keeps per token of a ``seq``-token row, split over TP. Rows packed
    behind a shared prompt carry their own positions, so the rotary cos / sin tables
    the q and k rotations keep are per token (``4 * head_dim``), not per position."""
    dtype = DTYPE_BYTES[model.dtype]
    elements = 4 * model.hidden_size + attention_elements(model) + mlp_elements(model, layer)
    if packed and not model.uses_mla:
        elements += 4 * model.head_dim
    log_sum_exp = model.num_attention_heads * F32
    return (elements * dtype + log_sum_exp) / tp + 2 * F32  # + the norms' inverse RMS


def mask_bytes_per_layer(config: MindRLConfig, shape: MicroBatchShape, packed: bool) -> int:
    """The additive mask one layer keeps for rows packed behind a shared prompt."""
    if not packed:
        return 0
    return shape.rows * shape.seq**2 * DTYPE_BYTES[config.model.dtype]


def backward_transient_bytes(
    model: ModelConfig, role_name: str, shape: MicroBatchShape, tp: int
) -> int:
    """What backward allocates beside the kept activations where it starts: the logits'
    gradients (the entropy's backward holds three float32 copies; the log-prob's alone
    one in float32 and one in the model's dtype) or the last layer's MLP input gradients
    (``2 f``), whichever is larger."""
    dtype = DTYPE_BYTES[model.dtype]
    widest = max(model.ffn_hidden_size, (model.moe_ffn_hidden_size or 0) * model.moe_router_topk)
    layer = shape.tokens * 2 * widest * dtype / tp
    per_logit = 3 * F32 if role_name == "actor" else F32 + dtype
    logits = shape.logit_positions * model.vocab_size / tp * per_logit
    if role_name == "critic":  # a value head: no vocabulary
        logits = 0
    return int(max(layer, logits))


def logit_bytes(config: MindRLConfig, role_name: str, shape: MicroBatchShape, tp: int) -> int:
    """The last stage's output: hidden states gathered at the response positions, their
    logits (vocabulary split over TP) and what the loss keeps of them."""
    model = config.model
    dtype = DTYPE_BYTES[model.dtype]
    if role_name == "critic":  # a value per position, no vocabulary
        return shape.tokens * F32
    per_logit = dtype + LOGPROB_LOGIT_BYTES + (ENTROPY_LOGIT_BYTES if role_name == "actor" else 0)
    logits = shape.logit_positions * (model.vocab_size // tp) * per_logit
    return shape.logit_positions * model.hidden_size * dtype + logits


def activation_bytes(config: MindRLConfig, role_name: str = "actor") -> int:
    """One micro-batch's activations at their peak on the busiest pipeline stage (what
    its forward kept, as its backward starts), times the micro-batches a pipeline keeps
    in flight there."""
    model, role = config.model, getattr(config, role_name)
    parallel = role.parallel
    whole = micro_batch_shape(config, role)
    shape = per_context_parallel_rank(whole, parallel.cp)
    packed = shares_prompts(config, role) and config.data.n_samples_per_prompt > 1
    dtype = DTYPE_BYTES[model.dtype]
    stages = stage_layer_counts(parallel, model.num_layers)
    first_layer = [sum(stages[:i]) for i in range(len(stages))]
    last = len(stages) - 1
    per_stage = []
    for index, layers in enumerate(stages):
        per_token = [
            layer_bytes_per_token(model, layer, shape.seq, parallel.tp, packed)
            for layer in range(first_layer[index], first_layer[index] + layers)
        ]
        mask = mask_bytes_per_layer(config, whole, packed)
        if role.activation_checkpointing:  # layer inputs kept, one layer recomputed
            kept = layers * model.hidden_size * dtype / parallel.tp + max(per_token, default=0)
            masks = mask
        else:
            kept, masks = sum(per_token), mask * layers
        edges = (index == 0) + (index == last)  # the embedding output, the final norm's
        stage = shape.tokens * (kept + edges * model.hidden_size * dtype / parallel.tp) + masks
        if index == last:
            stage += logit_bytes(config, role_name, shape, parallel.tp)
        in_flight = min(parallel.pp - index, micro_batches_per_step(config, role))
        per_stage.append(stage * max(in_flight, 1))
    return int(max(per_stage)) + backward_transient_bytes(model, role_name, shape, parallel.tp)
