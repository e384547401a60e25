"""Reward functions named in the config: parsed, imported and checked, each refusal one line."""

from __future__ import annotations

import sys
import textwrap

import pytest

from mindrl.rewards.functions import (
    BUILTINS,
    DEFAULT_TIMEOUT_S,
    FunctionSpec,
    LoadedFunction,
    RewardFunctionError,
    load_function,
    parse_function_spec,
)
from mindrl.rewards.inputs import RewardInput
from mindrl.rewards.registry import VERIFIERS

USER_MODULE = """
    import asyncio

    LIMIT = 3

    def score(inp, scale=1.0):
        return scale * float(inp.response == inp.answer)

    async def judged(inp):
        await asyncio.sleep(0)
        return 0.5

    def pair(inp, other):
        return 1.0

    def group_lengths(inputs):
        return [len(inp.response) for inp in inputs]

    class Scorer:
        def __call__(self, inp):
            return 1.0

    class AsyncScorer:
        async def __call__(self, inp):
            return 1.0

    scorer = Scorer()
    async_scorer = AsyncScorer()
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A user's reward module ``my_rewards`` importable from sys.path, as from PYTHONPATH."""
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent(USER_MODULE))
    (tmp_path / "broken_rewards.py").write_text("import not_installed_lib\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    # Each test writes its own file: the next one must import it, not this one's.
    for name in ("my_rewards", "broken_rewards"):
        sys.modules.pop(name, None)


def refusal(name: str, raw: dict) -> str:
    """The one-line message parsing and loading ``raw`` stops with."""
    with pytest.raises(RewardFunctionError) as caught:
        load_function(parse_function_spec(name, raw))
    message = str(caught.value)
    assert "\n" not in message
    return message


def answer_of(loaded: LoadedFunction, response: str = "4", answer: str = "4"):
    return loaded(RewardInput(uid="a#0", prompt="2+2=", response=response, answer=answer))


def test_a_user_function_is_parsed_with_its_settings_and_called_with_its_kwargs(user_module):
    raw = {"fn": "my_rewards:score", "kwargs": {"scale": 2.0}, "timeout_s": 5, "group": False}
    spec = parse_function_spec("mine", raw)
    assert spec == FunctionSpec("mine", "my_rewards:score", {"scale": 2.0}, 5.0, False)
    loaded = load_function(spec)
    assert not loaded.is_async
    assert answer_of(loaded) == 2.0
    assert answer_of(loaded, response="5") == 0.0


def test_defaults_are_no_kwargs_thirty_seconds_and_one_input_per_call(user_module):
    spec = parse_function_spec("mine", {"fn": "my_rewards:score"})
    assert (spec.kwargs, spec.timeout_s, spec.group) == ({}, DEFAULT_TIMEOUT_S, False)
    assert DEFAULT_TIMEOUT_S == 30.0


def test_async_functions_and_async_callable_objects_are_told_apart(user_module):
    assert load_function(parse_function_spec("j", {"fn": "my_rewards:judged"})).is_async
    assert load_function(parse_function_spec("o", {"fn": "my_rewards:async_scorer"})).is_async
    assert not load_function(parse_function_spec("s", {"fn": "my_rewards:scorer"})).is_async


def test_a_group_function_takes_the_list_of_inputs(user_module):
    loaded = load_function(
        parse_function_spec("g", {"fn": "my_rewards:group_lengths", "group": True})
    )
    inputs = [RewardInput("a#0", "p", text, "x") for text in ("ab", "abcd")]
    assert loaded.group
    assert loaded(inputs) == [2, 4]


@pytest.mark.parametrize(
    ("builtin", "response", "answer", "score"),
    [
        ("synthetic", "3 2", "3 1", 0.5),
        ("exact", "3 1", "3 1", 1.0),
        ("math", "so \\boxed{42}", "42", 1.0),
        ("math_format", "Answer: 41", "42", 1.0),
    ],
)
def test_builtins_score_like_the_verifiers_of_the_same_name(builtin, response, answer, score):
    loaded = load_function(parse_function_spec(builtin, {"builtin": builtin}))
    assert loaded.spec.target == BUILTINS[builtin]
    assert answer_of(loaded, response, answer) == score == VERIFIERS[builtin](response, answer)


def test_builtins_written_elsewhere_are_named_by_path_and_imported_only_when_used():
    assert BUILTINS["code_tests"] == "mindrl.rewards.code_tests:code_tests"
    assert BUILTINS["judge"] == "mindrl.rewards.judge:judge"
    assert set(BUILTINS) == {"synthetic", "exact", "math", "math_format", "code_tests", "judge"}


def test_a_path_without_a_colon_is_refused():
    assert refusal("my", {"fn": "foo.bar"}) == (
        "reward.functions.my: fn 'foo.bar' must be 'module:function'"
    )


def test_fn_and_builtin_together_or_neither_are_refused():
    expected = (
        "reward.functions.my: give exactly one of fn ('module:function') or builtin "
        "(code_tests, exact, judge, math, math_format, synthetic)"
    )
    assert refusal("my", {"fn": "a:b", "builtin": "math"}) == expected
    assert refusal("my", {"timeout_s": 3}) == expected


def test_an_unknown_builtin_lists_the_known_ones():
    assert refusal("my", {"builtin": "maths"}) == (
        "reward.functions.my: unknown builtin 'maths'; "
        "known: code_tests, exact, judge, math, math_format, synthetic"
    )


def test_unknown_keys_are_refused_with_the_known_ones():
    assert refusal("my", {"fn": "a:b", "timeout": 3}) == (
        "reward.functions.my: unknown key 'timeout' (known: builtin, fn, group, kwargs, timeout_s)"
    )


@pytest.mark.parametrize("timeout_s", [0, -1.5, "10", True, float("inf")])
def test_a_timeout_must_be_a_positive_number(timeout_s):
    assert refusal("my", {"fn": "a:b", "timeout_s": timeout_s}) == (
        f"reward.functions.my: timeout_s must be a number > 0, got {timeout_s!r}"
    )


def test_kwargs_must_be_a_mapping_and_group_a_boolean():
    assert refusal("my", {"fn": "a:b", "kwargs": [1]}) == (
        "reward.functions.my: kwargs must map names to values, got [1]"
    )
    assert refusal("my", {"fn": "a:b", "group": "yes"}) == (
        "reward.functions.my: group must be true or false, got 'yes'"
    )
    assert refusal("my", "a:b") == (  # type: ignore[arg-type]
        "reward.functions.my must be a mapping with fn or builtin, got 'a:b'"
    )


def test_a_module_that_is_not_on_the_path_is_named_with_the_import_error():
    assert refusal("my", {"fn": "no_such_rewards:score"}) == (
        "reward.functions.my: cannot import module 'no_such_rewards' (looked up on "
        "PYTHONPATH): ModuleNotFoundError: No module named 'no_such_rewards'"
    )


def test_a_module_whose_own_import_fails_names_what_it_lacks(user_module):
    assert refusal("my", {"fn": "broken_rewards:score"}) == (
        "reward.functions.my: cannot import module 'broken_rewards' (looked up on "
        "PYTHONPATH): ModuleNotFoundError: No module named 'not_installed_lib'"
    )


def test_a_missing_function_lists_the_module_file_and_its_callables(user_module):
    path = user_module / "my_rewards.py"
    assert refusal("my", {"fn": "my_rewards:scroe"}) == (
        f"reward.functions.my: module 'my_rewards' ({path}) has no 'scroe'; its callables: "
        "AsyncScorer, Scorer, async_scorer, group_lengths, judged, pair, score, scorer"
    )


def test_an_attribute_that_is_not_callable_is_refused(user_module):
    assert refusal("my", {"fn": "my_rewards:LIMIT"}) == (
        "reward.functions.my: 'my_rewards:LIMIT' is int 3, not a function"
    )


def test_a_signature_that_does_not_take_one_input_and_the_kwargs_is_named(user_module):
    assert refusal("my", {"fn": "my_rewards:pair"}) == (
        "reward.functions.my: my_rewards:pair(inp, other) cannot be called with one input "
        "and no kwargs: missing a required argument: 'other'"
    )
    assert refusal("my", {"fn": "my_rewards:score", "kwargs": {"scael": 2}}) == (
        "reward.functions.my: my_rewards:score(inp, scale=1.0) cannot be called with one "
        "input and kwargs {'scael': 2}: got an unexpected keyword argument 'scael'"
    )
    assert refusal("my", {"builtin": "math", "kwargs": {"strict": True}}) == (
        "reward.functions.my: mindrl.rewards.functions:math(inp: 'RewardInput') -> 'float' "
        "cannot be called with one input and kwargs {'strict': True}: got an unexpected "
        "keyword argument 'strict'"
    )
