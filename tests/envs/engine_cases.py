"""Run inside a spawned rank by test_engine_mask.py: multi-turn trajectories (observations
masked) trained by the real engine in float64, as plain rows, packed, and packed with
shared prompts."""

from __future__ import annotations

import torch

from backends.megatron import MegatronEngine, ParallelSpec, ResponseBatch
from backends.megatron.builder import destroy_parallel
from backends.megatron.sharding import gather_full_state_dict
from tests.megatron.cases import NO_CLIP, named_weights
from tests.megatron.packing_cases import DENSE64, MODES
from trainers.registry import get_algorithm

#: Each row: prompt ``A`` or ``B``, then (model, observation, model, ...) segment lengths.
ROWS = [("A", (2, 3, 2)), ("B", (1, 2, 1, 2, 1)), ("A", (3,)), ("A", (1, 1, 2))]


def trajectories(vocab: int, observation_advantage: float) -> ResponseBatch:
    """The rows with random tokens; advantages random on model tokens and
    ``observation_advantage`` on observations (which must not matter)."""
    gen = torch.Generator().manual_seed(21)
    prompts = {
        "A": torch.randint(1, vocab, (4,), generator=gen),
        "B": torch.randint(1, vocab, (3,), generator=gen),
    }
    width = max(sum(turns) for _, turns in ROWS)
    length = max(len(prompts[p]) for p, _ in ROWS) + width
    ids = torch.zeros(len(ROWS), length, dtype=torch.long)
    mask = torch.zeros(len(ROWS), width, dtype=torch.float64)
    for i, (name, turns) in enumerate(ROWS):
        row = torch.cat([prompts[name], torch.randint(1, vocab, (sum(turns),), generator=gen)])
        ids[i, : len(row)] = row
        column = 0
        for k, n in enumerate(turns):
            mask[i, column : column + n] = 1.0 if k % 2 == 0 else 0.0
            column += n
    advantages = torch.randn(len(ROWS), width, generator=gen, dtype=torch.float64)
    advantages = torch.where(mask > 0, advantages, observation_advantage)
    starts = torch.tensor([len(prompts[name]) for name, _ in ROWS])
    lengths = torch.tensor([sum(turns) for _, turns in ROWS])
    return ResponseBatch(ids, starts, mask, {"advantages": advantages}, response_lengths=lengths)


def train_one_step(pack: bool, share: bool, observation_advantage: float) -> dict:
    engine = MegatronEngine(DENSE64, ParallelSpec(), NO_CLIP, share_prompts=share, pack=pack)
    engine.load_full_state_dict(named_weights(engine.param_layouts()))
    batch = trajectories(DENSE64.vocab_size, observation_advantage)
    algorithm = get_algorithm("grpo")
    options = algorithm.resolve({"kl_coef": 0.0, "entropy_coef": 0.01})
    seen: dict[str, torch.Tensor] = {}

    def loss_fn(outputs, micro, counts):
        for key in ("logprobs", "entropy"):
            outputs[key].register_hook(
                lambda grad, key=key: seen.__setitem__(key, grad.detach().clone())
            )
        loss, _ = algorithm.actor_loss(
            outputs["logprobs"], micro.loss_inputs(), options, num_tokens=counts.tokens,
            entropy=outputs["entropy"], num_seqs=counts.sequences,
        )  # fmt: skip
        return loss

    metrics = engine.train_step(batch, loss_fn, micro_batch_size=None, with_entropy=True)
    result = {
        "layout": (engine.packs, engine.share_prompts),
        "mask": batch.response_mask,
        "output_grads": seen,
        "loss": metrics["loss"],
        "grads": gather_full_state_dict(engine.model, grads=True),
    }
    destroy_parallel()
    return result


def every_mode(rank: int, world: int) -> dict:
    """Each mode's step with observation advantages 0 and 1e6."""
    return {
        (mode, wild): train_one_step(pack, share, 1e6 if wild else 0.0)
        for mode, (pack, share) in MODES.items()
        for wild in (False, True)
    }
