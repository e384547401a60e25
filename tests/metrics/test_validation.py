"""Validation metrics: mean reward and the unbiased pass@k estimator."""

from __future__ import annotations

import pytest

from mindrl.metrics.validation import pass_at_k, validation_metrics


def test_pass_at_k_is_one_minus_the_chance_that_k_draws_all_fail():
    # 5 responses, 2 right: k=1 is the share right; k=2 misses only by drawing 2 of the 3
    # wrong ones, C(3,2)/C(5,2) = 3/10.
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(5, 2, 4) == pytest.approx(1.0)  # only 3 can fail


def test_pass_at_n_of_n_responses_is_whether_any_passed():
    assert [pass_at_k(4, c, 4) for c in range(5)] == [0.0, 1.0, 1.0, 1.0, 1.0]


def test_impossible_counts_are_refused():
    with pytest.raises(ValueError, match="n=3 c=4 k=1"):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError, match="n=3 c=1 k=4"):
        pass_at_k(3, 1, 4)


def test_validation_metrics_average_rewards_and_count_prompts_with_a_pass():
    rewards = [1.0, 0.5, 0.0, 0.0, 1.0, 1.0]  # 3 prompts x 2 responses, prompt-major
    passed = [True, False, False, False, True, True]
    metrics = validation_metrics(rewards, passed, n=2)
    assert metrics == {
        "val/reward_mean": pytest.approx(3.5 / 6),
        "val/pass@2": pytest.approx(2 / 3),
    }


def test_one_response_per_prompt_or_no_verdict_logs_no_pass_at_k():
    assert validation_metrics([0.25, 0.75], [False, True], n=1) == {"val/reward_mean": 0.5}
    assert validation_metrics([0.25, 0.75], None, n=2) == {"val/reward_mean": 0.5}


def test_rewards_that_are_not_whole_groups_are_refused():
    with pytest.raises(ValueError, match="whole groups of 2 rewards, got 3"):
        validation_metrics([1.0, 0.0, 1.0], [True, False, True], n=2)
