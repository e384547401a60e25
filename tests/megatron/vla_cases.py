"""VLA policy runs inside spawned ranks (``tests.support.spawn.run_ranks``), float64.

Every layout loads the same full weights (drawn per canonical name, ``cases.named_weights``)
and scores the same observations, so TP=2 must reproduce TP=1 to rounding.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from backends.megatron import MegatronEngine, OptimSpec, ParallelSpec
from backends.megatron.builder import destroy_parallel, initialize_parallel
from backends.megatron.families.vla import (
    ACTION_BINS,
    DEFAULT_TRUNK,
    ActionSampling,
    VLAObservation,
    VLAPolicy,
    VLASpec,
    build_vla,
)
from backends.megatron.layouts import param_layouts
from backends.megatron.sharding import gather_full_state_dict, load_full_state_dict
from tests.megatron.cases import NO_CLIP, named_weights

#: Small trunk; an odd vocabulary so TP=2 pads it, 4 heads in 2 groups split over TP.
TRUNK = replace(
    DEFAULT_TRUNK,
    num_layers=2,
    hidden_size=32,
    num_attention_heads=4,
    num_query_groups=2,
    ffn_hidden_size=64,
    vocab_size=25 + ACTION_BINS,
    dtype="float64",
)
VLA = VLASpec(image_size=16, patch_size=8, state_dim=3, action_dims=3, chunk_size=2)
#: The same policy with the ordinal (gaussian) action head, two keypoint tokens and a
#: value per action (the action level's head).
GAUSSIAN = replace(VLA, action_head="gaussian", keypoints=2, values_per_chunk=VLA.chunk_size)
SAMPLING = ActionSampling(temperature=0.8, top_k=50)
ROWS, PROMPT = 3, 5


def shared_weights(layouts: dict) -> dict[str, torch.Tensor]:
    """``cases.named_weights`` with the vocabulary padding rows zero, as every loader
    pads them (the same policy at every TP size), and a positive state range."""
    full = named_weights(layouts)
    for name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        full[name][TRUNK.vocab_size :] = 0.0
    # The state's range: drawn like a weight, kept a positive half-width.
    full["vla.state_half_range"] = 0.5 + full["vla.state_half_range"].abs()
    return full


def observation(vla: VLASpec = VLA, rows: int = ROWS, seed: int = 3) -> VLAObservation:
    gen = torch.Generator().manual_seed(seed)
    size = vla.image_size
    return VLAObservation(
        images=torch.randint(0, 256, (rows, size, size, 3), generator=gen, dtype=torch.uint8),
        states=torch.randn(rows, vla.state_dim, generator=gen, dtype=torch.float64),
        prompt_ids=torch.randint(0, TRUNK.vocab_size - ACTION_BINS, (rows, PROMPT), generator=gen),
    )


def policy_at(parallel: ParallelSpec, vla: VLASpec = VLA) -> VLAPolicy:
    """The VLA at ``parallel`` holding the shared full weights (drawn at TP=1 shapes)."""
    initialize_parallel(parallel)
    model = build_vla(TRUNK, vla, parallel)
    load_full_state_dict(model, shared_weights(param_layouts(model)))
    return VLAPolicy(model, TRUNK, vla)


def loss_of(scored: dict, action_ids: torch.Tensor) -> torch.Tensor:
    """Touches every output: a log-prob term weighted per token, entropy and values."""
    weights = torch.linspace(-1.0, 1.0, action_ids.numel(), dtype=torch.float64)
    policy = -(scored["logprobs"] * weights.reshape(action_ids.shape)).sum()
    return policy - 0.01 * scored["entropy"].sum() + (scored["values"] - 0.5).pow(2).sum()


def scored_and_generated(parallel: ParallelSpec, vla: VLASpec = VLA) -> dict:
    """Both decodes' chunks, the update's scoring of them, and the autoregressive
    scoring's gradients (full tensors, summed over TP where Megatron's rule says)."""
    policy = policy_at(parallel, vla)
    obs = observation()
    out = {"layouts": {n: tuple(lay.full_shape) for n, lay in param_layouts(policy.model).items()}}
    for decode in ("autoregressive", "parallel"):
        chunk = policy.generate(obs, SAMPLING, torch.Generator().manual_seed(11), decode)
        out[decode] = {
            "generated": chunk,
            "scored": {
                k: v.detach()
                for k, v in policy.score(obs, chunk.action_ids, SAMPLING, decode).items()
            },
        }
    out["values"] = policy.values(obs)
    ids = out["autoregressive"]["generated"].action_ids
    out["parallel_view_of_autoregressive"] = policy.score(obs, ids, SAMPLING, "parallel")[
        "logprobs"
    ].detach()
    policy.model.train()
    policy.model.zero_grad(set_to_none=True)
    scored = policy.score(obs, ids, SAMPLING)
    policy.backward(loss_of(scored, ids))
    out["grads"] = gather_full_state_dict(policy.model, grads=True)
    out["scored"] = {k: v.detach() for k, v in scored.items()}
    destroy_parallel()
    return out


def one_token_chunks() -> dict:
    """C=1, A=1: both decodes' first (only) token, drawn with the same seed."""
    vla = replace(VLA, action_dims=1, chunk_size=1)
    policy = policy_at(ParallelSpec(), vla)
    obs = observation(vla)
    out = {}
    for decode in ("autoregressive", "parallel"):
        logits, _ = policy._action_logits(
            obs, policy._action_inputs(torch.empty(ROWS, 0, dtype=torch.long), decode), 0, 1
        )
        chunk = policy.generate(obs, SAMPLING, torch.Generator().manual_seed(5), decode)
        out[decode] = {"logits": logits.detach(), "chunk": chunk}
    destroy_parallel()
    return out


def per_environment_noise() -> dict:
    """A batch drawn with one generator per row, and the same rows drawn in two batches
    with the same per-row seeds (as pipelined sub-simulators would split it)."""
    policy = policy_at(ParallelSpec())
    obs = observation()

    def rows(index: slice) -> VLAObservation:
        return VLAObservation(obs.images[index], obs.states[index], obs.prompt_ids[index])

    def seeded(index: range) -> list[torch.Generator]:
        return [torch.Generator().manual_seed(100 + row) for row in index]

    out = {}
    for decode in ("autoregressive", "parallel"):
        whole = policy.generate(obs, SAMPLING, seeded(range(ROWS)), decode)
        parts = [
            policy.generate(rows(slice(0, 1)), SAMPLING, seeded(range(0, 1)), decode),
            policy.generate(rows(slice(1, ROWS)), SAMPLING, seeded(range(1, ROWS)), decode),
        ]
        out[decode] = {"whole": whole, "parts": parts}
    try:
        policy.generate(rows(slice(0, 2)), SAMPLING, None, "parallel")
        bad = VLAObservation(obs.images.float(), obs.states, obs.prompt_ids)
        policy.generate(bad, SAMPLING)
    except ValueError as error:
        out["float_images"] = str(error)
    destroy_parallel()
    return out


MICRO_BATCHES = [slice(0, 1), slice(1, ROWS)]


def engine_step(
    parallel: ParallelSpec,
    checkpoint_root: str | None = None,
    dp_split: bool = False,
    optim: OptimSpec = NO_CLIP,
) -> dict:
    """The engine's VLA: one AdamW step (``optim``) on an autoregressive chunk's loss over
    :data:`MICRO_BATCHES` (with ``dp_split``, one per data-parallel rank), then its
    weights (saved under ``checkpoint_root`` when given)."""
    engine = MegatronEngine(TRUNK, parallel, optim, vla=VLA)
    micro_batches = MICRO_BATCHES
    if dp_split:
        micro_batches = [MICRO_BATCHES[engine.data_parallel_rank()]]
    initial = shared_weights(engine.param_layouts())
    engine.load_full_state_dict(initial)
    obs = observation()
    chunk = engine.vla_policy().generate(obs, SAMPLING, torch.Generator().manual_seed(11))

    def loss_fn(policy: VLAPolicy, rows: slice) -> torch.Tensor:
        part = VLAObservation(obs.images[rows], obs.states[rows], obs.prompt_ids[rows])
        ids = chunk.action_ids[rows]
        return loss_of(policy.score(part, ids, SAMPLING), ids)

    metrics = engine.train_vla_step(micro_batches, loss_fn)
    out = {"metrics": metrics, "initial": initial, "weights": engine.full_state_dict()}
    if checkpoint_root is not None:
        engine.save_checkpoint(checkpoint_root)
    destroy_parallel()
    return out


def resumed_weights(parallel: ParallelSpec, checkpoint_root: str) -> dict:
    """A fresh engine's weights after loading the checkpoint under ``checkpoint_root``."""
    engine = MegatronEngine(TRUNK, parallel, NO_CLIP, vla=VLA, seed=1)
    engine.load_checkpoint(checkpoint_root)
    weights = engine.full_state_dict()
    destroy_parallel()
    return weights


def default_size() -> int:
    """Parameters of the default policy (``DEFAULT_TRUNK`` + ``VLASpec()``)."""
    initialize_parallel(ParallelSpec())
    model = build_vla(DEFAULT_TRUNK, VLASpec(), ParallelSpec())
    count = sum(p.numel() for p in model.parameters())
    destroy_parallel()
    return count


def on_one_rank(rank: int, world: int, checkpoint_root: str) -> dict:
    return {
        "engine": engine_step(ParallelSpec(), checkpoint_root),
        "value_lr": engine_step(ParallelSpec(), optim=replace(NO_CLIP, lr=0.0, value_lr=1e-2)),
        "tp1": scored_and_generated(ParallelSpec()),
        "tp1_gaussian": scored_and_generated(ParallelSpec(), GAUSSIAN),
        "one_token": one_token_chunks(),
        "per_environment": per_environment_noise(),
        "default_size": default_size(),
    }


def on_two_ranks(rank: int, world: int, checkpoint_root: str) -> dict:
    return {
        "tp2": scored_and_generated(ParallelSpec(tp=2)),
        "tp2_gaussian": scored_and_generated(ParallelSpec(tp=2), GAUSSIAN),
        "engine": engine_step(ParallelSpec(tp=2)),
        "dp2_engine": engine_step(ParallelSpec(), dp_split=True),
        "resumed": resumed_weights(ParallelSpec(tp=2), checkpoint_root),
    }
