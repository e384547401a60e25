"""What a checkpoint and the HF export of a plan write: bytes per rank, time, memory.

A checkpoint (``backends/megatron/checkpoint.py``) holds each trained role's weights,
Adam moments and, for a 16-bit model under the distributed optimizer, the fp32 main
weights, as canonical tensors every rank of a pipeline stage writes an equal part of
(TP / EP shards split them, replicas share them by name): a rank writes its stage's bytes
over the stage's ranks, all ranks at once, and a background save (``checkpoint.async``)
first copies that part to host memory. The node's disk is shared by its ranks, so the
write takes the node's bytes at :data:`DISK_BYTES_PER_S`. The HF export streams one
tensor at a time: its memory is the largest tensor.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from mindrl.config import MindRLConfig
from mindrl.config.layout import TrainingLayout
from mindrl.planner.params import DTYPE_BYTES, lora_stage_params, model_params, stage_params
from mindrl.run_plan import RunPlan

#: The disk bandwidth the write time is quoted at, per node: one NVMe drive, or a node's
#: share of a parallel file system.
DISK_BYTES_PER_S = 2e9
TRAINED_ROLES = ("actor", "critic")
FP32 = 4


@dataclass(frozen=True)
class RoleCheckpoint:
    """One trained role's checkpoint (bytes)."""

    role: str
    weights: int  # the whole model's, in the model's dtype
    moments: int  # Adam's two moments
    main_weights: int  # fp32 copies of 16-bit weights (distributed optimizer)
    per_rank: int  # what the busiest stage's ranks each write (and copy, in the background)

    @property
    def total(self) -> int:
        return self.weights + self.moments + self.main_weights


def role_checkpoint(config: MindRLConfig, role: str, layout: TrainingLayout) -> RoleCheckpoint:
    model, optim = config.model, getattr(config, role).optim
    dtype = DTYPE_BYTES[model.dtype]
    # torch AdamW keeps moments in the weights' dtype; Megatron's in fp32 beside fp32 mains.
    moment = FP32 if optim.distributed_optimizer else dtype
    main = FP32 if optim.distributed_optimizer and dtype < FP32 else 0
    per_param = dtype + 2 * moment + main
    lora = getattr(config, role).lora
    if role == "actor" and lora.enabled:  # the adapters alone: the base is the run's model
        stages = lora_stage_params(model, lora, list(layout.stage_layers))
        params = sum(s.total for s in stages)
    else:
        stages = stage_params(model, list(layout.stage_layers))
        params = model_params(model).total
    ranks_per_stage = layout.world // layout.pp
    return RoleCheckpoint(
        role=role,
        weights=params * dtype,
        moments=params * 2 * moment,
        main_weights=params * main,
        per_rank=max(s.total for s in stages) * per_param // ranks_per_stage,
    )


def largest_hf_tensor(config: MindRLConfig) -> int:
    """Bytes of the largest tensor an HF export holds at once (a fused Megatron tensor is
    read whole: ``[gate; up]``, the fused qkv)."""
    m = config.model
    h, dtype = m.hidden_size, DTYPE_BYTES[m.dtype]
    candidates = [m.vocab_size * h, 2 * m.ffn_hidden_size * h]
    if m.is_moe:
        candidates.append(2 * (m.moe_ffn_hidden_size or m.ffn_hidden_size) * h)
    if not m.uses_mla:
        candidates.append(h * m.head_dim * (m.num_attention_heads + 2 * m.num_kv_heads))
    else:
        heads = m.num_attention_heads
        candidates.append(m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim))
    return max(candidates) * dtype


def checkpoint_plan(config: MindRLConfig, plan: RunPlan) -> dict:
    """Per trained role and per node: checkpoint bytes and the write time at
    :data:`DISK_BYTES_PER_S`; the HF export's size and memory."""
    training = plan.layout.training
    roles = [role_checkpoint(config, r, training[r]) for r in TRAINED_ROLES if r in training]
    ranks_per_node = min(config.resources.devices_per_node, plan.layout.train_devices)
    per_node = sum(r.per_rank for r in roles) * ranks_per_node
    return {
        "roles": [asdict(r) | {"total": r.total} for r in roles],
        "per_node": per_node,
        "disk_bytes_per_s": DISK_BYTES_PER_S,
        "write_seconds": per_node / DISK_BYTES_PER_S,
        "background": config.checkpoint.async_save,
        "hf_bytes": model_params(config.model).total * DTYPE_BYTES[config.model.dtype],
        "hf_largest_tensor": largest_hf_tensor(config),
    }
