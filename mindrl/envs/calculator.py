"""Calculator tool for the maths word problems: the model writes ``<calc>3*(4+5)</calc>``,
the environment answers ``<result>27</result>``; a turn that states ``Answer: n`` (or
calls no tool) ends the episode and is scored by the maths task's own verifier
(:func:`mindrl.rewards.math_reward`, math-verify against the record's answer).

The expression is parsed with :mod:`ast` and evaluated node by node over numbers and
``+ - * / // % **`` and parentheses only, never with ``eval``: model text is untrusted
input, and ``eval`` would run any Python it wrote. Sizes are bounded so a sampled
``9**9**9`` costs nothing: the expression's length, the exponent and every intermediate
result's magnitude. A call that cannot be evaluated gets ``<result>error: why</result>``,
which the model sees like any other observation.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from typing import ClassVar

from mindrl.data.math_tasks import FEW_SHOT_HEADER
from mindrl.data.records import PromptRecord
from mindrl.rewards.maths import ANSWER_MARK, math_reward

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = 10**18

Number = int | float

BINARY_OPERATORS: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
UNARY_OPERATORS: dict[type[ast.unaryop], Callable[[Number], Number]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}


class CalculatorError(ValueError):
    """An expression the calculator refuses; the message is what the model is shown."""


def evaluate_arithmetic(expression: str) -> Number:
    """The value of an arithmetic ``expression`` (numbers, ``+ - * / // % **``, parentheses).

    ``x`` and ``÷`` are read as ``*`` and ``/``, and thousands separators are dropped
    ("1,200"), as word-problem text writes them.

    Raises:
        CalculatorError: not arithmetic (names, calls, attributes, strings, ...), a syntax
            error, division by zero, or a size past the bounds above.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    normalized = re.sub(r"(?<=\d),(?=\d{3})", "", expression)
    normalized = normalized.replace("x", "*").replace("×", "*").replace("÷", "/").strip()
    try:
        tree = ast.parse(normalized, mode="eval")
    except SyntaxError:
        raise CalculatorError("not an arithmetic expression") from None
    return _checked(_value(tree.body))


def _value(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY_OPERATORS:
        return UNARY_OPERATORS[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY_OPERATORS:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponent larger than {MAX_EXPONENT}")
        try:
            return _checked(BINARY_OPERATORS[type(node.op)](left, right))
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("number too large") from None
    raise CalculatorError(f"only numbers and + - * / // % ** ( ) are allowed, not {_shown(node)}")


def _checked(value: Number) -> Number:
    if isinstance(value, complex):  # a negative number to a fractional power
        raise CalculatorError("not a real number")
    if (isinstance(value, float) and not math.isfinite(value)) or abs(value) > MAX_MAGNITUDE:
        raise CalculatorError("number too large")
    return value


def _shown(node: ast.AST) -> str:
    return ast.unparse(node)[:40] if isinstance(node, ast.expr) else type(node).__name__


def format_number(value: Number) -> str:
    """``27`` for a whole number (also ``27.0``), else up to 10 significant digits."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.10g}"
    return str(value)


CALL = re.compile(r"<calc>(.*?)</calc>", re.DOTALL)
# Worked examples in the tool's format, replacing the task's plain few-shot example, so a
# small pretrained model sees a call, its result and the final answer line.
TOOL_FEW_SHOT = (
    "Question: Ben has 4 boxes with 6 cards in each box. How many cards does Ben have in "
    "total?\n<calc>4*6</calc><result>24</result>\nAnswer: 24\n\n"
    "Question: Ana had 31 coins and gave away 9. How many coins does Ana have left?\n"
    "<calc>31-9</calc><result>22</result>\nAnswer: 22\n\n"
)


class CalculatorEnv:
    """The maths word problem with a calculator: call it, read the result, answer.

    A turn ends when the model closes its call (``stop_strings``), so the result comes
    right after the call instead of text the model made up in its place.

    Each turn is read in order: a turn that states a final answer (``Answer: n``) before
    any call ends the episode with the maths reward of that first answer line (what the
    model writes after it, a next question of its own, is not scored); a turn whose first
    call comes first is answered with ``<result>value</result>`` (reward 0, not done); a
    turn with neither
    ends the episode, scored as its text stands (the verifier's first-line fallback).
    Text the model wrote after its call, before seeing the result, is ignored.

    Args:
        few_shot: Start from worked examples of the tool (the record's own few-shot
            example, if any, is replaced). Without it the record's prompt is used as is.
    """

    stop_strings: ClassVar[tuple[str, ...]] = ("</calc>",)

    def __init__(self, few_shot: bool = True) -> None:
        self.few_shot = few_shot
        self.answer = ""

    def reset(self, record: PromptRecord) -> str:
        """The record's question, after worked examples of the calculator, ending in a
        newline: the model's turn is a call or ``Answer: n``."""
        self.answer = record.answer
        if not self.few_shot:
            return record.text
        question = record.text.removeprefix(FEW_SHOT_HEADER)
        question = question.removesuffix("Answer:").rstrip() + "\n"
        return TOOL_FEW_SHOT + question

    def step(self, action: str) -> tuple[str, float, bool]:
        """The call's result as observation, or the final answer's reward and done."""
        call = CALL.search(action)
        answered = ANSWER_MARK.search(action)
        if answered is not None and (call is None or answered.start() < call.start()):
            return "", math_reward(_through_line_of(action, answered.end()), self.answer), True
        if call is None:
            return "", math_reward(action, self.answer), True
        return f"<result>{_result(call.group(1))}</result>\n", 0.0, False


def _through_line_of(text: str, position: int) -> str:
    # The first answer counts: a model that goes on to a next "Question: ... Answer: n" of
    # its own is not scored on that one (the verifier reads the last "Answer:").
    end = text.find("\n", position)
    return text if end < 0 else text[:end]


def _result(expression: str) -> str:
    try:
        return format_number(evaluate_arithmetic(expression))
    except CalculatorError as refused:
        return f"error: {refused}"
