"""Log-probs and entropy from vocab-parallel logits (backends/megatron/logprobs.py)."""

from __future__ import annotations

from tests.megatron import logprob_cases
from tests.support.spawn import run_ranks


def test_scoring_one_row_leaves_its_logits_for_the_entropy_taken_after():
    # Megatron's cross entropy works in place; one row is where it used to get the
    # caller's tensor itself.
    (result,) = run_ranks(logprob_cases.one_row_scored_twice, 1)
    assert result["logits_untouched"]
    assert result["entropy_error"] < 1e-12
    assert result["logprob_error"] < 1e-6  # Megatron's kernel sums in float32
