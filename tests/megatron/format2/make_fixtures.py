"""How the format-2 checkpoints beside this file were written (kept for the record).

They are checkpoints of the format mindrl wrote before sharded checkpoints (format 2: full
canonical weights in ``model.safetensors``, AdamW moments in ``optimizer.safetensors``, a
distributed optimizer's Megatron DP-zero state in ``optimizer/rank_*``), written by this
script at commit 82ec73c, the last to write that format::

    git checkout 82ec73c && python -m tests.megatron.format2.make_fixtures

A tiny dense model trains 2 steps and saves, then goes on 2 more steps; ``expected.json``
holds those 2 losses, which a resumed run must reproduce
(``tests/megatron/test_checkpoint_layouts.py``). At HEAD the engine writes format 3, so
the script no longer produces these files; the checkpoints are data.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import torch.distributed as dist

from backends.megatron import GPTSpec, MegatronEngine, OptimSpec, ParallelSpec
from backends.megatron.builder import destroy_parallel
from tests.megatron.cases import MICRO, data_stream, named_weights, policy_loss
from tests.support.spawn import run_ranks

HERE = Path(__file__).parent
SPEC = GPTSpec(
    family="qwen2",
    num_layers=2,
    hidden_size=32,
    num_attention_heads=4,
    num_query_groups=2,
    ffn_hidden_size=64,
    vocab_size=64,
    add_qkv_bias=True,
    tie_word_embeddings=True,
)
ADAMW = OptimSpec(
    lr=1e-2, lr_schedule="cosine", lr_warmup_steps=1, total_steps=4, clip_grad=0.5
)  # (spelt schedule= / warmup_steps= at 82ec73c)
DISTRIBUTED = dataclasses.replace(ADAMW, distributed_optimizer=True)
#: name -> (layout, optimizer)
FIXTURES = {
    "adamw_tp2": (ParallelSpec(tp=2), ADAMW),
    "distributed_dp2": (ParallelSpec(), DISTRIBUTED),
}


def _loss(engine: MegatronEngine, position: int) -> float:
    batch = data_stream(engine.spec, position)
    rows = len(batch) // engine.data_parallel_size()
    first = engine.data_parallel_rank() * rows
    share = batch.rows(slice(first, first + rows))
    return engine.train_step(share, policy_loss, MICRO, with_entropy=True)["loss"]


def write(rank: int, world: int, name: str) -> list[float]:
    parallel, optim = FIXTURES[name]
    full = named_weights(MegatronEngine(SPEC, ParallelSpec()).param_layouts())
    engine = MegatronEngine(SPEC, parallel, optim, seed=1)
    engine.load_full_state_dict(full)
    for position in range(2):
        _loss(engine, position)
    engine.save_checkpoint(HERE / name / "actor", data_position={"next_step": 2})
    after = [_loss(engine, position) for position in range(2, 4)]
    destroy_parallel()
    dist.barrier()
    return after


if __name__ == "__main__":
    for fixture in FIXTURES:
        shutil.rmtree(HERE / fixture, ignore_errors=True)
        losses = run_ranks(write, 2, fixture)[0]
        (HERE / fixture / "expected.json").write_text(json.dumps({"next_losses": losses}))
