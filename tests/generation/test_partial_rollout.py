"""Partial rollout through a real dock (the shared Ray cluster) and a real engine: a paused
response resumes from exactly its prefix, and every token keeps the log-prob of the
weights that sampled it (mindrl/workers/generation.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from backends.generation import SamplingParams
from mindrl.workers.generation import PartialRollout, generate_into_dock, paused_prefixes
from tests.generation.conftest import (
    INDEXES,
    NOTHING,
    PROMPTS,
    N,
    dock_with_prompts,
    reference_model,
)

pytestmark = pytest.mark.ray

LENGTH = 9  # a whole response; no stop token, so each runs to this length


@pytest.fixture
def dock(ray_cluster):
    yield from dock_with_prompts(["prompt_ids", "response_ids"])


def one_iteration(dock, engine, budget: int, resumed: np.ndarray, seed: int) -> dict:
    params = SamplingParams(temperature=1.0, max_tokens=LENGTH, seed=seed)
    partial = PartialRollout(budget, LENGTH, resumed)
    return generate_into_dock(dock, engine.generate, INDEXES, params, N, partial=partial)


def teacher_forced_logprobs(weights, prompt: list[int], response: list[int]) -> torch.Tensor:
    """log p(response[t] | prompt, response[:t]) under ``weights``, recomputed by HF."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = reference_model(weights)(ids).logits[0, len(prompt) - 1 : -1].double()
    return logits.log_softmax(-1).gather(-1, torch.tensor(response)[:, None])[:, 0]


def test_a_paused_response_resumes_from_its_prefix_with_each_tokens_own_logprob(
    dock, engine, weights_a, weights_b
):
    first = one_iteration(dock, engine, budget=3, resumed=NOTHING, seed=1)
    assert first["response_tokens"] == 3 * len(PROMPTS)
    assert first["paused"].tolist() == INDEXES.tolist()
    # Paused: kept in the dock where no stage claims it.
    assert dock.ready_count("reward", ["response_ids"]) == 0
    before = paused_prefixes(dock, INDEXES, INDEXES)
    assert [len(p.token_ids) for p in before] == [3] * len(PROMPTS)
    try:
        engine.load_weights(weights_b.items())  # the next iteration's policy
        last = one_iteration(dock, engine, budget=LENGTH, resumed=first["paused"], seed=2)
    finally:
        engine.load_weights(weights_a.items())
    assert last["response_tokens"] == (LENGTH - 3) * len(PROMPTS)
    assert last["paused"].tolist() == []
    data = dock.fetch(INDEXES, ["response_ids", "rollout_logprob"])
    for k, prefix in enumerate(before):
        response = data["response_ids"][k, :LENGTH].tolist()
        logprob = data["rollout_logprob"][k, :LENGTH].double()
        assert response[:3] == prefix.token_ids  # continued from exactly its prefix
        assert logprob[:3].tolist() == prefix.logprobs  # its log-probs kept bit for bit
        # Tokens 0-2 were sampled by weights a, 3-8 by weights b: each carries its own.
        sampled_by_a = teacher_forced_logprobs(weights_a, PROMPTS[k], response)[:3]
        sampled_by_b = teacher_forced_logprobs(weights_b, PROMPTS[k], response)[3:]
        assert logprob[:3] == pytest.approx(sampled_by_a.tolist(), abs=1e-4)
        assert logprob[3:] == pytest.approx(sampled_by_b.tolist(), abs=1e-4)
    assert dock.ready_count("reward", ["response_ids"]) == len(PROMPTS)


def mixed_group_iteration(dock, engine) -> dict:
    """A budget-2 call in which one group has a finished and a paused response: stop
    tokens are the even ids, so about half the responses end within two tokens; seeds are
    tried until one mixes (the prompts are put afresh each time)."""
    for seed in range(50):
        dock.recycle(INDEXES)
        dock.put(INDEXES, {"prompt_ids": [torch.tensor(p) for p in PROMPTS]})
        params = SamplingParams(
            max_tokens=LENGTH, stop_token_ids=tuple(range(0, 256, 2)), seed=seed
        )
        partial = PartialRollout(2, LENGTH, NOTHING)
        report = generate_into_dock(dock, engine.generate, INDEXES, params, N, partial=partial)
        paused_groups = set((report["paused"] // N).tolist())
        if 0 < len(report["paused"]) < len(paused_groups) * N:
            return report
    raise AssertionError("no seed gave a group with both a finished and a paused response")


def test_a_group_is_claimed_only_once_every_response_finished(dock, engine):
    report = mixed_group_iteration(dock, engine)
    paused = set(report["paused"].tolist())
    finished = [i for i in INDEXES.tolist() if i not in paused]
    for index in finished:  # ended by a stop token within the budget
        row = dock.fetch(np.array([index]), ["response_ids"])
        length = int(row["response_ids_lengths"][0])
        assert length <= 2 and int(row["response_ids"][0, length - 1]) % 2 == 0
    for prefix in paused_prefixes(dock, report["paused"], report["paused"]):
        assert len(prefix.token_ids) == 2 and all(t % 2 for t in prefix.token_ids)
    whole = [i for i in finished if not {i // N * N + k for k in range(N)} & paused]
    # Every finished response is in the dock, but a whole-group claim takes only the
    # groups with nothing paused: the others' finished responses wait for their group.
    assert dock.ready_count("reward", ["response_ids"]) == len(finished) > len(whole)
    claimable = dock.claim("reward", ["response_ids"], len(whole), whole_groups=True)[0]
    assert sorted(claimable.tolist()) == whole
