"""Log-prob and entropy scenarios run inside a spawned rank by ``test_logprobs.py``."""

from __future__ import annotations

import torch

from backends.megatron import ParallelSpec
from backends.megatron.builder import destroy_parallel, initialize_parallel
from backends.megatron.logprobs import vocab_parallel_entropy, vocab_parallel_logprobs


def one_row_scored_twice(rank: int, world: int) -> dict:
    """Log-probs then entropy of one row's logits ``[1, s, v]``, as the engine takes them
    for a packed row or a context-parallel shard, against torch's own."""
    initialize_parallel(ParallelSpec())
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 5, 11, generator=generator, dtype=torch.float64)
    targets = torch.randint(0, 11, (1, 5), generator=generator)
    before = logits.clone()
    logprobs = vocab_parallel_logprobs(logits, targets, 11)
    entropy = vocab_parallel_entropy(logits, 11)
    expected = torch.distributions.Categorical(logits=before)
    destroy_parallel()
    return {
        "logits_untouched": torch.equal(logits, before),
        "logprob_error": (logprobs - expected.log_prob(targets)).abs().max().item(),
        "entropy_error": (entropy - expected.entropy()).abs().max().item(),
    }
