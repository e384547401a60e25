"""A run's rewards from its config: functions by name, routes by domain, the weighted sum
over the functions that did not abstain, failures named, and what the record shows."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from mindrl.data.records import PromptRecord
from mindrl.rewards.inputs import ERROR, INVALID, TIMEOUT, RewardInput
from mindrl.rewards.registry import score_batch
from mindrl.rewards.report import FailureWindow, RewardBook, RewardsFailed, scoring_report
from mindrl.rewards.routing import RewardConfigError, check_functions, reward_spec, unrouted_problem
from mindrl.rewards.scoring import RewardScorer

USER_MODULE = textwrap.dedent(
    """
    import time

    def length(inp, scale=1.0):
        return scale * len(inp.response)

    def only_code(inp):
        return None if inp.domain != "code" else {"score": 1.0, "style": 0.5}

    def crashes(inp):
        raise ValueError("no tests in this row\\nsecond line")

    def sleeps(inp):
        time.sleep(30)

    def nan(inp):
        return float("nan")

    def abstains(inp):
        return None

    def longest_in_group(inputs):
        best = max(len(i.response) for i in inputs)
        return [float(len(i.response) == best) for i in inputs]

    async def shouts(inp):
        return float(inp.response.isupper())
    """
)


@pytest.fixture
def user_rewards(tmp_path, monkeypatch):
    (tmp_path / "user_rewards.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "user_rewards"


def fn(name: str, **extra) -> dict:
    return {"fn": f"user_rewards:{name}", **extra}


def sample(response: str, domain: str = "default", uid: str = "q#1", answer: str = "7"):
    return RewardInput(uid, "Q?", response, answer, domain, {})


def test_without_routes_the_verifiers_score_every_domain_exactly_as_score_batch_did():
    spec = reward_spec(["synthetic", "exact"], {}, {})
    responses, truths = ["4", "4 2", "x", "1 2 3"], ["4", "4 1", "4", "1 2 3"]
    inputs = [
        RewardInput(f"q#{i}", "p", r, t, "any")
        for i, (r, t) in enumerate(zip(responses, truths, strict=True))
    ]
    scored = RewardScorer(spec, processes=1).score(inputs)
    expected = score_batch(responses, truths, ["synthetic", "exact"]).numpy()
    assert scored.rewards.tobytes() == expected.tobytes()  # bit for bit
    assert not scored.failed.any() and spec.pooled() == []


def test_a_route_sums_the_weighted_scores_of_the_functions_that_did_not_abstain(user_rewards):
    spec = reward_spec(
        [],
        {"length": fn("length", kwargs={"scale": 0.5}), "only_code": fn("only_code")},
        {"code": [{"fn": "length", "weight": 2.0}, "only_code"], "math": ["math", "only_code"]},
    )
    scorer = RewardScorer(spec, processes=1)
    try:
        scored = scorer.score([sample("abcd", "code"), sample("The answer is 7", "math")])
    finally:
        scorer.close()
    assert scored.rewards.tolist() == [2.0 * 0.5 * 4 + 1.0, 1.0]  # math: only_code abstained
    assert scored.functions["only_code"].statuses == {"ok": 1, "abstain": 1}
    assert scored.passed.tolist() == [True, True]


def test_every_failure_is_named_with_its_function_status_and_prompt(user_rewards):
    functions = {n: fn(n, timeout_s=0.5) for n in ("crashes", "sleeps", "nan", "abstains")}
    routes = {d: [d] for d in functions}
    scorer = RewardScorer(reward_spec([], functions, routes), processes=2)
    try:
        inputs = [sample("x", d, uid=f"{d}#1") for d in functions]
        scored = scorer.score(inputs)
    finally:
        scorer.close()
    assert scored.failed.tolist() == [True] * 4 and scored.rewards.tolist() == [0.0] * 4
    statuses = [(f.uid, f.function, f.status) for f in scored.failures]
    assert statuses == [
        ("crashes#1", "crashes", ERROR),
        ("sleeps#1", "sleeps", TIMEOUT),
        ("nan#1", "nan", INVALID),
        ("abstains#1", "every function", "abstain"),
    ]
    assert scored.failures[0].line() == (
        "reward function 'crashes' error on crashes#1: crashes raised ValueError: no tests in "
        "this row"
    )


def test_a_group_function_gets_each_groups_inputs_together_and_async_ones_run(user_rewards):
    functions = {"best": fn("longest_in_group", group=True), "shouts": fn("shouts")}
    spec = reward_spec([], functions, {"default": ["best", "shouts"]})
    assert spec.uses_groups
    scorer = RewardScorer(spec, processes=1)
    try:
        inputs = [sample(r) for r in ("ab", "ABC", "a", "xyz")]
        scored = scorer.score(inputs, groups=np.array([0, 0, 1, 1]))
    finally:
        scorer.close()
    assert scored.rewards.tolist() == [0.0, 2.0, 0.0, 1.0]


def test_a_domain_of_the_data_without_a_route_is_named_with_three_of_its_rows():
    spec = reward_spec([], {}, {"math": ["math"]})
    domains = ["math", "code", "code", "code", "code"]
    uids = [f"d.jsonl#{i}" for i in range(5)]
    assert unrouted_problem(spec, domains, uids) == (
        "the data holds domain 'code' (rows d.jsonl#1, d.jsonl#2, d.jsonl#3) but "
        "reward.routes gives it no route (routes: math); add reward.routes.code"
    )
    assert unrouted_problem(spec, ["math"], ["a"]) is None


@pytest.mark.parametrize(
    ("functions", "routes", "problem"),
    [
        ({}, {"math": [{"fn": "nope"}]}, "reward.routes names function 'nope', which is neither"),
        ({"f": {"fn": "json:dumps"}}, {}, "reward.functions.f is in no route"),
        ({}, {"math": []}, "reward.routes.math must be a non-empty list"),
        ({}, {"math": [{"fn": "math", "weight": "x"}]}, "weight must be a finite number"),
        ({}, {"math": [{"fn": "math", "wieght": 1}]}, "unknown key 'wieght'"),
    ],
)
def test_a_reward_section_that_cannot_score_is_refused_in_one_line(functions, routes, problem):
    with pytest.raises(RewardConfigError, match=problem):
        reward_spec([], functions, routes)


def test_a_function_with_the_wrong_signature_is_refused_before_the_run(user_rewards):
    spec = reward_spec([], {"f": fn("length", kwargs={"size": 2})}, {"default": ["f"]})
    with pytest.raises(RewardConfigError, match=r"user_rewards:length\(inp, scale=1.0\) cannot"):
        check_functions(spec)


def test_the_record_shows_each_domains_reward_and_each_functions_outcomes(user_rewards):
    functions = {"length": fn("length"), "crashes": fn("crashes")}
    spec = reward_spec([], functions, {"code": ["length"], "math": ["crashes"]})
    scorer = RewardScorer(spec, processes=1)
    try:
        inputs = [sample("ab", "code"), sample("abcd", "code"), sample("x", "math", uid="m#3")]
        scored = scorer.score(inputs)
    finally:
        scorer.close()
    book = RewardBook()
    book.add([{"count": 3, **scoring_report(scored, np.array([10, 11, 12]), inputs)}])
    metrics = book.metrics()
    assert metrics["reward/code"] == 3.0 and "reward/math" not in metrics  # failed: left out
    assert metrics["reward_fn/crashes/error_rate"] == 1.0
    assert metrics["reward_fn/length/error_rate"] == 0.0
    assert metrics["reward/failed_share"] == pytest.approx(1 / 3)
    assert book.failed_indexes.tolist() == [12]


def failing_book(failed: int, scored: int) -> RewardBook:
    book = RewardBook(scored=scored)
    book.failed.append(np.arange(failed))
    from mindrl.rewards.scoring import Failure

    book.failures.append(Failure(0, "q#9", "judge", INVALID, "judge: no verdict"))
    return book


def test_stop_ends_the_run_on_the_first_failure_naming_it():
    window = FailureWindow("stop", 0.05)
    window.check(RewardBook(scored=128))
    with pytest.raises(RewardsFailed, match=r"^reward function 'judge' invalid on q#9: judge: no"):
        window.check(failing_book(1, 128))


def test_failures_past_the_allowed_share_of_the_last_iterations_end_the_run():
    window = FailureWindow("drop_group", 0.05)
    for _ in range(19):
        window.check(failing_book(6, 128))  # 4.7 %: tolerated
    with pytest.raises(RewardsFailed, match=r"of the last 20 iteration\(s\) failed their reward"):
        window.check(failing_book(40, 128))


def test_a_record_of_the_data_scores_the_same_in_validation(user_rewards):
    record = PromptRecord("v#1", "Q: 7?", "7", "7?", "code", {"tests": []})
    assert RewardInput.of(record, "ok") == RewardInput(
        "v#1", "7?", "ok", "7", "code", {"tests": []}
    )


def test_a_dry_run_refuses_a_missing_reward_function_in_one_line(user_rewards, capsys):
    from trainers.driver.cli import main

    args = ["--trainer", "grpo", "--config", "configs/tiny.yaml", "--dry-run"]
    routed = ["reward.functions={f: {fn: 'user_rewards:lenght'}}", "reward.routes={default: [f]}"]
    assert main([*args, *routed]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("mindrl-train: config error: reward.functions.f: module 'user_rewards'")
    assert line.endswith(
        "has no 'lenght'; its callables: abstains, crashes, length, longest_in_group, nan, "
        "only_code, shouts, sleeps"
    )
