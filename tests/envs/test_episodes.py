"""The episode loop (mindrl/workers/episodes.py) through a real dock, real environment
workers (Ray actors on the shared test cluster) and a real hf engine with the tiny
tokenizer: what a trajectory holds, how episodes end, and how steps overlap."""

from __future__ import annotations

import time

import numpy as np
import pytest
import ray
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from backends.generation import EngineConfig, SamplingParams, get_engine_class
from mindrl.data import PromptRecord, build_tiny_tokenizer
from mindrl.data.records import RECORD_FIELDS, record_fields
from mindrl.dock import DockClient, create_dock, shutdown_dock
from mindrl.dock.schema import RUN_FIELDS
from mindrl.envs import EnvironmentFailed
from mindrl.rewards import score_batch
from mindrl.workers.env_worker import env_worker_class
from mindrl.workers.episodes import EnvSettings, TextCodec, run_episodes_into_dock
from mindrl.workers.generation import generate_into_dock

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]

TOKENIZER = build_tiny_tokenizer()
EOS = TOKENIZER.eos_token_id
RECORDS = [
    PromptRecord("p0", "next : 3 =", "4"),
    PromptRecord("p1", "copy : 5 1 =", "5 1"),
    PromptRecord("p2", "reverse : 2 8 =", "8 2"),
]
N = 2  # episodes per prompt
INDEXES = np.arange(len(RECORDS) * N)
CODEC = TextCodec(TOKENIZER, "never")
MODULE = "tests.envs.toy_envs"


@pytest.fixture(scope="module")
def engine():
    config = LlamaConfig(
        vocab_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=64, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    weights = LlamaForCausalLM(config).state_dict()
    engine = get_engine_class("hf")(
        EngineConfig(model=config, max_model_len=48, kv_cache_bytes=16 * 2**20, seed=0)
    )
    engine.load_weights(weights.items())
    return engine


@pytest.fixture
def dock():
    stages = {"rollout": ["prompt_ids", *RECORD_FIELDS], "reward": ["response_ids", "env_reward"]}
    handle = create_dock(
        RUN_FIELDS, stages, n_samples=len(INDEXES), group_size=N, warehouses=1, timeout_s=30
    )
    client = DockClient(handle)
    prompts = [torch.tensor(TOKENIZER(RECORDS[i // N].text)["input_ids"]) for i in INDEXES]
    client.put(
        INDEXES, {"prompt_ids": prompts, **record_fields([RECORDS[i // N] for i in INDEXES])}
    )
    yield client
    shutdown_dock(handle)


def env_workers(cls: str, count: int = 2, **kwargs):
    return [env_worker_class().remote(r, count, f"{MODULE}:{cls}", kwargs) for r in range(count)]


def run(dock, engine, cls, turns, turn_tokens, room, seed=5, generate=None, **kwargs):
    params = SamplingParams(temperature=1.0, max_tokens=room, stop_token_ids=(EOS,), seed=seed)
    settings = EnvSettings(turns, turn_tokens, room, max_prompt=16)
    workers = env_workers(cls, **kwargs)
    try:
        return run_episodes_into_dock(
            dock, generate or engine.generate, workers, INDEXES, params, settings, CODEC,
        )  # fmt: skip
    finally:
        for worker in workers:
            ray.kill(worker)


def trajectories(dock) -> dict[str, list]:
    data = dock.fetch(INDEXES, ["response_ids", "rollout_logprob", "loss_mask", "env_reward"])
    lengths = data["response_ids_lengths"].tolist()
    return {
        "ids": [row[:n].tolist() for row, n in zip(data["response_ids"], lengths, strict=True)],
        "logprob": [
            row[:n].tolist() for row, n in zip(data["rollout_logprob"], lengths, strict=True)
        ],
        "mask": [row[:n].tolist() for row, n in zip(data["loss_mask"], lengths, strict=True)],
        "reward": data["env_reward"].tolist(),
    }


def test_one_turn_episodes_sample_exactly_what_the_single_turn_rollout_samples(dock, engine):
    report = run(dock, engine, "OneShot", turns=1, turn_tokens=4, room=4)
    episodes = trajectories(dock)
    params = SamplingParams(temperature=1.0, max_tokens=4, stop_token_ids=(EOS,), seed=5)
    generate_into_dock(dock, engine.generate, INDEXES, params, N)  # overwrites the responses
    single = trajectories(dock)
    assert episodes["ids"] == single["ids"] and episodes["logprob"] == single["logprob"]
    assert all(
        mask == [1.0] * len(ids) for mask, ids in zip(episodes["mask"], single["ids"], strict=True)
    )
    truths = [RECORDS[i // N].answer for i in INDEXES]
    assert episodes["reward"] == score_batch(single["ids"], truths, tokenizer=TOKENIZER).tolist()
    assert report["env_turns"] == len(INDEXES) and report["env_observation_tokens"] == 0


def test_a_trajectory_is_turns_and_observations_with_the_observations_masked(dock, engine):
    report = run(dock, engine, "Recall", turns=2, turn_tokens=2, room=8)
    seven = TOKENIZER.convert_tokens_to_ids("7")
    got = trajectories(dock)
    for ids, logprob, mask, reward in zip(
        got["ids"], got["logprob"], got["mask"], got["reward"], strict=True
    ):
        at = ids.index(seven, 1 if ids[0] == seven else 0)  # the observation after turn 1
        first = [1.0] * at
        assert 1 <= at <= 2 and mask[: at + 1] == [*first, 0.0] and logprob[at] == 0.0
        second = ids[at + 1 :]
        assert 1 <= len(second) <= 2 and mask[at + 1 :] == [1.0] * len(second)
        assert reward == float(CODEC.decode(second).split()[:1] == ["7"])
    assert report["env_turns"] == 2 * len(INDEXES) and report["env_observation_tokens"] == len(
        INDEXES
    )
    assert report["env_truncated_max_turns"] == report["env_truncated_context"] == 0
    # Every episode stepped twice; each step timed inside the environment and before it.
    assert report["env_steps"] == 2 * len(INDEXES)
    assert report["env_step_s"] > 0 and report["env_step_queue_s"] >= 0


@pytest.mark.parametrize(
    ("turns", "room", "cut_by", "reward", "length"),
    [(3, 12, "env_truncated_max_turns", 0.75, 9), (3, 6, "env_truncated_context", 0.5, 5)],
)
def test_an_episode_cut_by_max_turns_or_the_context_is_counted_and_ends_on_a_model_token(
    dock, engine, turns, room, cut_by, reward, length
):
    # One-token turns, three-token observations: turn, obs, turn, obs, turn = 9 tokens;
    # with room 6 the second observation and a third turn do not fit.
    report = run(dock, engine, "Talkative", turns=turns, turn_tokens=1, room=room)
    got = trajectories(dock)
    assert report[cut_by] == len(INDEXES) and report["env_turns"] == len(INDEXES) * (
        turns if length == 9 else 2
    )
    assert all(
        len(ids) == length and mask[-1] == 1.0
        for ids, mask in zip(got["ids"], got["mask"], strict=True)
    )
    assert got["reward"] == [reward] * len(INDEXES)


def test_a_turn_ends_at_its_first_stop_string_in_the_engine_and_in_the_trajectory(dock, engine):
    calls = []

    def recorded(prompts, params):
        results = engine.generate(prompts, params)
        calls.append((params, results))
        return results

    run(dock, engine, "StopsAtDigit", turns=1, turn_tokens=8, room=8, generate=recorded)
    digits = {TOKENIZER.convert_tokens_to_ids(d) for d in "0123456789"}
    ((params, results),) = calls
    assert set(params.stop_sequences) == {(d,) for d in digits}  # the engine was told
    got = trajectories(dock)
    stopped = [ids[-1] in digits for ids in got["ids"]]
    assert any(stopped)
    for ids, result, reward, stop in zip(got["ids"], results, got["reward"], stopped, strict=True):
        assert ids == result.token_ids  # the engine itself ended the turn there
        assert not digits & set(ids[:-1])  # at the first digit, nothing after it
        assert reward == float(stop) and (stop or len(ids) == 8 or ids[-1] == EOS)


def test_a_start_the_environment_makes_replaces_the_prompt(dock, engine):
    run(dock, engine, "Restart", turns=1, turn_tokens=2, room=4)
    data = dock.fetch(INDEXES, ["prompt_ids"])
    expected = TOKENIZER("copy : 1 2 =")["input_ids"]
    assert all(row[: len(expected)].tolist() == expected for row in data["prompt_ids"])


def test_an_environment_that_raises_ends_the_rollout_in_one_line_naming_it_and_the_prompt(
    dock, engine
):
    with pytest.raises(EnvironmentFailed) as err:
        run(dock, engine, "Raises", turns=2, turn_tokens=2, room=8)
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith(
        f"environment {MODULE}:Raises raised in step (ValueError: the tool crashed)"
    )
    assert "on the episode whose prompt is '" in line


def test_a_slow_step_delays_only_its_own_episode(dock, engine):
    calls = []

    def timed(prompts, params):
        start = time.perf_counter()
        out = engine.generate(prompts, params)
        calls.append((len(prompts), start, time.perf_counter()))
        return out

    # Four episodes' steps take 0.2 s each (concurrently, not 0.8 s in a row); the two of
    # prompt p1 take 3 s.
    run(dock, engine, "Sleepy", turns=2, turn_tokens=2, room=8, generate=timed,
        slow_uid="p1", slow_s=3.0, fast_s=0.2)  # fmt: skip
    sizes = [size for size, _, _ in calls]
    # The four went on in a call of their own, started before the slow steps were back
    # (a call after those would hold all six); the slow two came in a third call, which
    # started after their 3 s steps ended.
    assert sizes == [6, 4, 2]
    assert calls[2][1] - calls[0][2] >= 3.0
