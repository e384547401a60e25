"""Maths rewards through math-verify, also off the main thread (Ray actor threads)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from mindrl.rewards import extract_final_answer, math_format_reward, math_reward
from mindrl.rewards.maths import signal_timeouts_allowed


@pytest.mark.parametrize(
    "response",
    ["\\boxed{42}", "42.0", " 42", "42\n\nQuestion: Ben has 7 cards.", "So Answer: 42 apples"],
)
def test_correct_answers_in_any_form_score_one(response):
    assert math_reward(response, "42") == 1.0


@pytest.mark.parametrize("response", ["41", "\\boxed{43}", "Answer: 4.2", "", "forty-two"])
def test_wrong_or_missing_answers_score_zero(response):
    assert math_reward(response, "42") == 0.0


def test_final_answer_is_taken_after_the_last_answer_mark():
    assert extract_final_answer("Answer: 3\nthen Answer: 17 cookies\nmore") == "17 cookies"
    assert extract_final_answer("\n\n 12\n 99") == "12"
    assert math_reward("Answer: 3\nAnswer: 17", "17") == 1.0


def test_format_reward_needs_a_parseable_answer_not_a_right_one():
    assert math_format_reward("41", "42") == 1.0
    assert math_format_reward("no idea", "42") == 0.0


def test_math_verify_runs_in_worker_threads_without_signal_timeouts():
    assert signal_timeouts_allowed()
    responses = ["\\boxed{42}", "42.0", "41", "Answer: 7"]
    truths = ["42", "42", "42", "7"]
    with ThreadPoolExecutor(max_workers=2) as pool:
        allowed = pool.submit(signal_timeouts_allowed).result()
        rewards = list(pool.map(math_reward, responses, truths))
    assert allowed is False
    assert rewards == [1.0, 1.0, 0.0, 1.0]
