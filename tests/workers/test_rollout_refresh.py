"""The actor's generation side reshards only when told the weights changed: a later
partial-rollout round of the same iteration (``refresh_weights(reshard=False)``) keeps
the engine's weights and still sends the training state to the host
(mindrl/workers/rollout.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from backends.generation import SamplingParams
from tests.support.spawn import run_ranks

TINY = Path(__file__).parents[2] / "configs" / "tiny.yaml"
PROMPTS = [[1, 5, 9], [2, 7, 7, 3, 11]]
GREEDY = SamplingParams(temperature=0, max_tokens=5)


def refresh_case(rank: int, world: int) -> dict:
    from mindrl.config.layout import training_layout
    from mindrl.config.loader import load_config
    from mindrl.config.specs import parallel_spec
    from mindrl.workers.model_setup import initial_model
    from mindrl.workers.roles import MegatronEngine
    from mindrl.workers.rollout import Rollout

    # Training TP2 -> generation TP1 (DP2), the tiny recipe's hand-over, with the swap on.
    config = load_config(TINY, ["rollout.swap=true"])
    initial = initial_model(config.model)
    layout = training_layout(config.actor, config.model, world)
    trainer = MegatronEngine(initial.spec, parallel_spec(layout), seed=config.seed)
    rollout = Rollout(trainer, config, initial, world)

    def decode(reshard: bool) -> dict:
        rollout.refresh_weights(reshard=reshard)
        out = {
            "tokens": [list(r.token_ids) for r in rollout.generate(PROMPTS, GREEDY)],
            "swapped_bytes": rollout.resharder.host.swapped_bytes,
        }
        rollout.restore_training_state()
        return out

    first = decode(reshard=True)
    with torch.no_grad():  # what an update would do, without telling the engine
        for param in trainer.named_parameters().values():
            param.mul_(-1.5)
    kept = decode(reshard=False)
    fresh = decode(reshard=True)
    return {"first": first, "kept": kept, "fresh": fresh}


def test_a_later_round_keeps_the_engines_weights_and_still_swaps_the_training_state_out():
    for rank in run_ranks(refresh_case, 2, timeout_s=180):
        # No reshard: the engine decodes with the weights it was given, not the changed ones.
        assert rank["kept"]["tokens"] == rank["first"]["tokens"]
        # The training state left the device for generation in every round alike.
        assert rank["kept"]["swapped_bytes"] == rank["first"]["swapped_bytes"] > 0
        # A reshard hands the changed weights over (they decode differently).
        assert rank["fresh"]["tokens"] != rank["first"]["tokens"]
