"""Reward functions named in the config, checked and loaded.

``reward.functions: {NAME: {fn: "package.module:function" | builtin: NAME, kwargs: {...},
timeout_s: S, group: false}}`` names each function the run scores with. A function takes
one :class:`~mindrl.rewards.inputs.RewardInput` (``group: true``: a prompt's list of them)
plus ``kwargs`` as keyword arguments and answers as :mod:`mindrl.rewards.inputs` says.

:func:`load_function` runs when the config loads (``--dry-run`` included) and again on
every reward worker, so a wrong path or signature stops the run before any sample is
generated, with one line that names what was found. The built-in functions are named by
``module:function`` too and imported only when used: ``code_tests`` and ``judge`` pull in
what they need (a sandbox, an HTTP client) only in runs that name them.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# The verifiers' own modules, not the registry (which imports torch): a pool process that
# runs a built-in then needs no torch once mindrl.rewards itself stops importing it.
from mindrl.rewards.digits import digit_partial_reward, exact_match_reward
from mindrl.rewards.inputs import RewardInput
from mindrl.rewards.maths import math_format_reward, math_reward

#: The built-in functions by name: ``builtin: NAME`` in the config.
BUILTINS: dict[str, str] = {
    "synthetic": "mindrl.rewards.functions:synthetic",
    "exact": "mindrl.rewards.functions:exact",
    "math": "mindrl.rewards.functions:math",
    "math_format": "mindrl.rewards.functions:math_format",
    "code_tests": "mindrl.rewards.code_tests:code_tests",
    "judge": "mindrl.rewards.judge:judge",
}

DEFAULT_TIMEOUT_S = 30.0
KEYS = ("fn", "builtin", "kwargs", "timeout_s", "group")
#: How many of a module's callables a "has no function" message lists.
LISTED_CALLABLES = 8


class RewardFunctionError(ValueError):
    """A reward function the config names cannot be used; the message is one line."""


@dataclass(frozen=True)
class FunctionSpec:
    """One entry of ``reward.functions``, validated but not imported.

    Attributes:
        name: its key in ``reward.functions`` (how metrics and errors name it).
        target: ``"module:function"`` (a builtin's entry of :data:`BUILTINS`).
        kwargs: keyword arguments of every call.
        timeout_s: wall seconds a call may take before it counts as ``timeout``.
        group: whether it scores a prompt's N responses in one call.
    """

    name: str
    target: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S
    group: bool = False


@dataclass(frozen=True)
class LoadedFunction:
    """A :class:`FunctionSpec` with its function imported and its signature checked.

    Attributes:
        spec: what the config said.
        fn: the user's function (called as ``fn(inputs, **spec.kwargs)``).
        is_async: an ``async def`` (it runs on an event loop, not in a pool process).
    """

    spec: FunctionSpec
    fn: Callable[..., Any]
    is_async: bool

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def group(self) -> bool:
        return self.spec.group

    @property
    def timeout_s(self) -> float:
        return self.spec.timeout_s

    def __call__(self, inputs: RewardInput | list[RewardInput]) -> Any:
        """The function's answer for ``inputs`` (a coroutine when it is async)."""
        return self.fn(inputs, **self.spec.kwargs)


def parse_function_spec(name: str, raw: Mapping[str, Any]) -> FunctionSpec:
    """The spec of ``reward.functions.<name>``: exactly one of ``fn`` / ``builtin``, no
    unknown keys, ``timeout_s > 0`` (default 30).

    Raises:
        RewardFunctionError: one line naming the entry and what is wrong with it.
    """
    where = f"reward.functions.{name}"
    if not isinstance(raw, Mapping):
        raise RewardFunctionError(f"{where} must be a mapping with fn or builtin, got {raw!r}")
    unknown = [str(key) for key in raw if key not in KEYS]
    if unknown:
        known = ", ".join(sorted(KEYS))
        raise RewardFunctionError(f"{where}: unknown key {unknown[0]!r} (known: {known})")
    return FunctionSpec(
        name=name,
        target=_target(where, raw),
        kwargs=_kwargs(where, raw.get("kwargs")),
        timeout_s=_timeout(where, raw.get("timeout_s", DEFAULT_TIMEOUT_S)),
        group=_flag(where, "group", raw.get("group", False)),
    )


def _target(where: str, raw: Mapping[str, Any]) -> str:
    if ("fn" in raw) == ("builtin" in raw):
        builtins = ", ".join(sorted(BUILTINS))
        raise RewardFunctionError(
            f"{where}: give exactly one of fn ('module:function') or builtin ({builtins})"
        )
    if "builtin" in raw:
        builtin = raw["builtin"]
        if builtin not in BUILTINS:
            known = ", ".join(sorted(BUILTINS))
            raise RewardFunctionError(f"{where}: unknown builtin {builtin!r}; known: {known}")
        return BUILTINS[builtin]
    target = raw["fn"]
    module, _, attribute = target.partition(":") if isinstance(target, str) else ("", "", "")
    if not module or not attribute:
        raise RewardFunctionError(f"{where}: fn {target!r} must be 'module:function'")
    return target


def _kwargs(where: str, kwargs: Any) -> dict[str, Any]:
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping) or not all(isinstance(key, str) for key in kwargs):
        raise RewardFunctionError(f"{where}: kwargs must map names to values, got {kwargs!r}")
    return dict(kwargs)


def _timeout(where: str, timeout_s: Any) -> float:
    number = isinstance(timeout_s, int | float) and not isinstance(timeout_s, bool)
    if not number or not timeout_s > 0 or timeout_s == float("inf"):
        raise RewardFunctionError(f"{where}: timeout_s must be a number > 0, got {timeout_s!r}")
    return float(timeout_s)


def _flag(where: str, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise RewardFunctionError(f"{where}: {key} must be true or false, got {value!r}")
    return value


def load_function(spec: FunctionSpec) -> LoadedFunction:
    """Import ``spec.target`` and check it can be called as the config says: with one
    input positionally and ``spec.kwargs`` by name.

    Raises:
        RewardFunctionError: one line naming the entry and what was found: a module that
            does not import, a missing attribute, one that is not callable, a signature
            that does not take the call.
    """
    fn = import_target(spec)
    _check_signature(spec, fn)
    return LoadedFunction(spec, fn, is_async=_is_async(fn))


def import_target(spec: FunctionSpec) -> Callable[..., Any]:
    """The callable ``spec.target`` names (imported from ``sys.path``: PYTHONPATH), without
    the signature check (the pool's processes import what the caller already checked).

    Raises:
        RewardFunctionError: as :func:`load_function`.
    """
    where = f"reward.functions.{spec.name}"
    module_name, _, attribute = spec.target.partition(":")
    if not module_name or not attribute:
        raise RewardFunctionError(f"{where}: fn {spec.target!r} must be 'module:function'")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # a module may raise anything while it imports
        raise RewardFunctionError(
            f"{where}: cannot import module {module_name!r} (looked up on PYTHONPATH): "
            f"{first_line(error)}"
        ) from error
    fn = _attribute(module, attribute)
    if fn is None:
        raise RewardFunctionError(
            f"{where}: module {module_name!r} ({_file_of(module)}) has no {attribute!r}; "
            f"its callables: {_callables_of(module)}"
        )
    if not callable(fn):
        raise RewardFunctionError(
            f"{where}: {spec.target!r} is {type(fn).__name__} {_short(fn)}, not a function"
        )
    return fn


def _attribute(module: Any, path: str) -> Any:
    """``module.a.b`` for ``a.b`` (a method of a class or object the module holds)."""
    value = module
    for part in path.split("."):
        value = getattr(value, part, None)
        if value is None:
            return None
    return value


def _check_signature(spec: FunctionSpec, fn: Callable[..., Any]) -> None:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a C function without a readable signature: the call will tell
    try:
        signature.bind(object(), **spec.kwargs)
    except TypeError as error:
        kwargs = f"kwargs {spec.kwargs}" if spec.kwargs else "no kwargs"
        raise RewardFunctionError(
            f"reward.functions.{spec.name}: {spec.target}{signature} cannot be called with "
            f"one input and {kwargs}: {error}"
        ) from None


def _is_async(fn: Callable[..., Any]) -> bool:
    """An ``async def`` function, or an object whose ``__call__`` is one."""
    if inspect.iscoroutinefunction(fn):
        return True
    return not inspect.isroutine(fn) and inspect.iscoroutinefunction(type(fn).__call__)


def _callables_of(module: Any) -> str:
    names = sorted(
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and callable(value)
        and getattr(value, "__module__", None) == module.__name__
    )
    if not names:
        return "none"
    shown = ", ".join(names[:LISTED_CALLABLES])
    more = len(names) - LISTED_CALLABLES
    return shown + (f" (+{more} more)" if more > 0 else "")


def _file_of(module: Any) -> str:
    return getattr(module, "__file__", None) or "a namespace package"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def first_line(error: BaseException) -> str:
    """``Type: first line of the message``: what a one-line report says of an exception."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


# The built-in functions over today's verifiers (registry.VERIFIERS of the same name):
# ``verifier(response, ground_truth)``.


def synthetic(inp: RewardInput) -> float:
    """Digit tasks: the share of answer positions right."""
    return digit_partial_reward(inp.response, inp.answer)


def exact(inp: RewardInput) -> float:
    """1.0 when the response holds exactly the answer's symbols."""
    return exact_match_reward(inp.response, inp.answer)


def math(inp: RewardInput) -> float:
    """1.0 when the final answer equals the ground truth mathematically (math-verify)."""
    return math_reward(inp.response, inp.answer)


def math_format(inp: RewardInput) -> float:
    """1.0 when the response states a parseable final answer, right or wrong."""
    return math_format_reward(inp.response, inp.answer)
