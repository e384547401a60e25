"""Continuous batching in the engines (``GenerationEngine.continuous``): sequences join a
running batch as others end, an interrupted sequence continues from its context, and
weights loaded between two steps serve the live sequences' next tokens."""

from __future__ import annotations

import pytest
import torch

from backends.generation import SamplingParams
from backends.generation.base import SequenceRequest
from tests.generation.conftest import MAX_MODEL_LEN, reference_model
from tests.generation.test_engines import FP32_ATOL, argmax_decode, full_forward_logprobs

PROMPTS = [[5, 17, 33], [200, 4], [9, 9, 9, 9, 9, 61], [77]]
GREEDY = SamplingParams(temperature=0)


def run(batch, waves: dict[int, list[SequenceRequest]]) -> tuple[dict, int]:
    """Step ``batch`` until it is empty, adding ``waves[s]`` before step ``s``; every
    output by key and the steps taken."""
    outputs, step = {}, 0
    while step in waves or batch.live or any(s > step for s in waves):
        batch.add(waves.get(step, []))
        for output in batch.step():
            outputs[output.key] = output
        step += 1
    return outputs, step


def test_sequences_joining_a_running_batch_decode_as_alone(engine, reference_a):
    lengths = [12, 3, 7, 9]
    pairs = enumerate(zip(PROMPTS, lengths, strict=True))
    requests = [SequenceRequest(k, p, n) for k, (p, n) in pairs]
    # Two sequences start; the others join at steps 2 and 5, while the first still decode.
    outputs, steps = run(
        engine.continuous(GREEDY), {0: requests[:2], 2: requests[2:3], 5: requests[3:]}
    )
    assert steps == 5 + lengths[3]  # the last joiner's 9 tokens, one per step
    for k, prompt in enumerate(PROMPTS):
        assert outputs[k].token_ids == argmax_decode(reference_a, prompt, lengths[k])
        expected = full_forward_logprobs(reference_a, prompt, outputs[k].token_ids)
        torch.testing.assert_close(
            torch.tensor(outputs[k].logprobs), expected, atol=FP32_ATOL, rtol=0
        )
        assert outputs[k].finish_reason == "length"


def test_an_interrupted_sequence_continues_from_its_context(engine, reference_a):
    batch = engine.continuous(GREEDY)
    batch.add([SequenceRequest(0, PROMPTS[0], 10), SequenceRequest(1, PROMPTS[2], 10)])
    for _ in range(4):
        assert batch.step() == []
    assert batch.progress() == {0: 4, 1: 4}
    stopped = {o.key: o for o in batch.interrupt()}
    assert batch.live == 0 and {o.finish_reason for o in stopped.values()} == {"interrupted"}
    # Continued later, prompt + its 4 tokens as the context: the 6 tokens left.
    again = engine.continuous(GREEDY)
    outputs, _ = run(again, {0: [SequenceRequest(0, PROMPTS[0] + stopped[0].token_ids, 6)]})
    assert stopped[0].token_ids + outputs[0].token_ids == argmax_decode(reference_a, PROMPTS[0], 10)


def test_a_stop_token_or_the_context_window_ends_a_sequence(engine, reference_a):
    whole = argmax_decode(reference_a, PROMPTS[1], 8)
    stop = SamplingParams(temperature=0, stop_token_ids=(whole[3],))
    first = whole.index(whole[3]) + 1
    room = MAX_MODEL_LEN - len(PROMPTS[0])
    outputs, _ = run(
        engine.continuous(stop),
        {0: [SequenceRequest(0, PROMPTS[1], 8), SequenceRequest(1, [7] * 60, 4, True)]},
    )
    assert (outputs[0].token_ids, outputs[0].finish_reason) == (whole[:first], "stop")
    assert room > 4 and outputs[1].finish_reason == "context_limit"


def test_a_stop_sequence_ends_a_sequence_after_it(engine, reference_a):
    whole = argmax_decode(reference_a, PROMPTS[2], 10)
    stop = SamplingParams(temperature=0, stop_sequences=(tuple(whole[4:6]),))
    first = next(i + 2 for i in range(9) if whole[i : i + 2] == whole[4:6])
    outputs, _ = run(engine.continuous(stop), {0: [SequenceRequest(0, PROMPTS[2], 10)]})
    assert (outputs[0].token_ids, outputs[0].finish_reason) == (whole[:first], "stop")


def test_weights_loaded_between_steps_serve_the_next_tokens(engine, weights_a, weights_b):
    batch = engine.continuous(GREEDY)
    batch.add([SequenceRequest(0, PROMPTS[0], 8)])
    for _ in range(3):
        batch.step()
    try:
        engine.load_weights(weights_b.items())
        (output,) = run(batch, {})[0].values()
    finally:
        engine.load_weights(weights_a.items())
    tokens = output.token_ids
    model_a, model_b = reference_model(weights_a), reference_model(weights_b)
    assert tokens[:3] == argmax_decode(model_a, PROMPTS[0], 3)
    # Token 3 was sampled by weights b, reading the keys and values weights a computed
    # for the context (the live sequence keeps its cache): b's step over a's cache.
    with torch.no_grad():
        cache = model_a(torch.tensor([PROMPTS[0] + tokens[:2]]), use_cache=True).past_key_values
        logits = model_b(torch.tensor([tokens[2:3]]), past_key_values=cache).logits[0, -1]
    expected = torch.log_softmax(logits.float(), dim=-1)[tokens[3]]
    assert output.logprobs[3] == pytest.approx(float(expected), abs=FP32_ATOL)
    a_only = full_forward_logprobs(model_a, PROMPTS[0], tokens[:4])[3]
    assert abs(output.logprobs[3] - float(a_only)) > 1e-3


def test_sampling_is_seeded_per_batch_and_top_k_one_is_greedy(engine, reference_a):
    def sampled(params: SamplingParams) -> dict[int, list[int]]:
        requests = [SequenceRequest(k, PROMPTS[0], 8) for k in range(4)]
        outputs, _ = run(engine.continuous(params), {0: requests})
        return {k: o.token_ids for k, o in outputs.items()}

    seeded = SamplingParams(temperature=1.0, seed=7)
    assert sampled(seeded) == sampled(seeded)
    assert len({tuple(t) for t in sampled(seeded).values()}) > 1  # copies differ
    assert sampled(SamplingParams(temperature=1.0, seed=8)) != sampled(seeded)
    top1 = sampled(SamplingParams(temperature=1.0, top_k=1, seed=7))
    assert all(t == argmax_decode(reference_a, PROMPTS[0], 8) for t in top1.values())


def test_slot_refill_samples_what_one_batch_call_samples_under_greedy(engine):
    # Two slots for four sequences: the third and fourth take the slots of the first two
    # as they end, yet each gets the tokens and log-probs of the engine's batch call.
    lengths = [3, 9, 5, 4]
    whole = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=max(lengths)))
    batch = engine.continuous(GREEDY)
    queue = [
        SequenceRequest(k, p, n) for k, (p, n) in enumerate(zip(PROMPTS, lengths, strict=True))
    ]
    outputs = {}
    batch.add(queue[:2])
    queue = queue[2:]
    while batch.live or queue:
        ended = batch.step()
        batch.add(queue[: len(ended)])
        queue = queue[len(ended) :]
        assert batch.live <= 2
        outputs |= {o.key: o for o in ended}
    for k, result in enumerate(whole):
        assert outputs[k].token_ids == result.token_ids[: lengths[k]]
        torch.testing.assert_close(
            torch.tensor(outputs[k].logprobs),
            torch.tensor(result.logprobs[: lengths[k]]),
            atol=FP32_ATOL,
            rtol=0,
        )
