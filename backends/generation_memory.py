"""What the transformers engine holds per sequence it generates, in bytes.

Plain arithmetic, no torch: the hf engine sizes its batches with it
(``backends/generation/hf_engine.py``) and the planner sizes the rollout stage with the
same numbers (``mindrl/planner``), so the two cannot drift apart.

Per sequence the engine keeps, until the batch ends, its KV cache over the whole
context (``generate``'s cache grows by one position per step up to ``max_model_len``)
and the raw float32 logits of every step (``output_logits=True``: the behaviour
log-probs are read from them after sampling).
"""

from __future__ import annotations

#: Bytes of one raw logit the engine keeps (transformers copies each step's to float32).
LOGIT_BYTES = 4


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, elem_bytes: int) -> int:
    """Keys and values of one token over all layers."""
    return 2 * layers * kv_heads * head_dim * elem_bytes


def sequence_bytes(max_model_len: int, steps: int, kv_per_token: int, vocab: int) -> int:
    """One sequence: its KV cache at full length and ``steps`` rows of raw logits."""
    return max_model_len * kv_per_token + steps * vocab * LOGIT_BYTES


def prompts_per_call(budget: float, per_sequence: int, samples_per_prompt: int) -> int:
    """Prompts one ``generate`` call takes so their sequences fit ``budget`` (at least 1)."""
    return max(1, int(budget // per_sequence) // samples_per_prompt)
