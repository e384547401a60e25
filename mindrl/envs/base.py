"""The environment interface of multi-turn runs, and the loader of a run's environment class.

An environment is any class with these two methods (``async def`` versions accepted):

``reset(self, record: PromptRecord) -> str``
    Called once, first, on a fresh instance: ``record`` is the episode's prompt record
    (``uid``, ``text``: the prompt before any chat template, ``answer``: its ground truth).
    Returns the text the episode starts with: ``record.text`` itself (the usual case: the
    trajectory then starts with exactly the tokens a single-turn run's prompt has), or
    anything the environment makes of it (a puzzle it drew, a task statement); a text
    other than ``record.text`` is rendered and tokenized the way the dataset renders
    prompts (``data.chat_template``) and replaces the prompt.

``step(self, action: str) -> tuple[str, float, bool]``
    Called after each model turn with the turn's text (decoded as the verifiers decode
    a response: cut at the stop token, other special tokens kept; a turn ends at the
    stop token, ``env.max_turn_tokens`` or the trajectory's room). Returns ``(observation,
    reward, done)``: ``observation`` is text appended verbatim after the model's turn
    (its tokens are trained on nowhere: their loss mask is 0), ``reward`` this step's
    reward (the episode's reward is the sum over its steps), ``done`` ends the episode.
    The episode also ends after ``env.max_turns`` turns, or when the context (the
    rollout's ``max_prompt_length + max_response_length``) has no room for the
    observation and one more token; the observation of the last step is then not
    appended (no model turn follows it), so a trajectory always ends with a model token.

``async def``: either method may be a coroutine function; it is awaited on the
environment worker's event loop, so an environment that waits on I/O (a sandbox, an
HTTP tool) gives way to the other episodes while it waits. A plain method runs on a
thread of the worker, so a slow synchronous ``step`` delays its own episode only.

Two optional class attributes:

``stop_strings: tuple[str, ...]`` (default none)
    Texts that end a model turn as soon as the model writes one (``("</calc>",)``: the
    turn ends when the model closes its tool call, not at ``env.max_turn_tokens``). The
    turn keeps the stop string (the policy produced it, the loss sees it) and nothing
    after it; ``step`` gets that text. The engine stops a row when it samples one of
    them as the tokenizer spells it, and the episode loop cuts any turn whose decoded
    text contains one however it was spelled (docs/architecture.md §12).

``max_concurrent_steps: int | None`` (default None: no limit)
    How many ``step`` calls one environment worker runs at once (1: one at a time, for
    an environment whose instances share something that is not safe to use from two
    threads). A step waiting for its turn is timed apart from the step itself
    (``env_step_queue_s_mean`` and ``env_step_s_mean``).

One instance per episode, built as ``cls(**env.kwargs)`` on an environment worker (a
Ray actor, ``env.workers`` of them): the same instance sees the episode's ``reset`` and
every ``step``, and nothing else. The class is named ``"package.module:ClassName"``
and imported on the workers from any module on ``PYTHONPATH`` (the user's own file, not
only mindrl's; docs/architecture.md §12).

A method that raises ends the run in one line naming the class and the episode's prompt
(:class:`EnvironmentFailed`).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import time
from typing import Any, Protocol, runtime_checkable

from mindrl.config.class_path import EnvConfigError, split_class_path
from mindrl.data.records import PromptRecord

#: A step's result: the observation text, this step's reward, whether the episode ended.
StepResult = tuple[str, float, bool]


@runtime_checkable
class Environment(Protocol):
    """What a run's ``env.cls`` provides (see the module docstring for the semantics)."""

    def reset(self, record: PromptRecord) -> str: ...

    def step(self, action: str) -> StepResult: ...


class EnvironmentFailed(ValueError):
    """An environment's ``reset`` or ``step`` raised or returned something else than the
    interface says; the one-line message names the class and the episode's prompt.

    A ``ValueError``, this project's type of user mistakes: the run ends at once, never
    restarted (``resilience.max_restarts``) into the same failing environment."""


def import_class(path: str) -> type:
    """The class ``path`` (``"package.module:ClassName"``) names, imported from
    ``PYTHONPATH``.

    Raises:
        EnvConfigError: no such module or class.
    """
    module_name, class_name = split_class_path(path)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if _missing_dependency(module_name, exc):
            raise EnvConfigError(f"env.cls {path!r}: {exc}") from None
        raise EnvConfigError(
            f"env.cls {path!r}: cannot import {module_name!r} ({exc}); put its folder on PYTHONPATH"
        ) from None
    cls = getattr(module, class_name, None)
    if not inspect.isclass(cls):
        raise EnvConfigError(
            f"env.cls {path!r}: module {module_name!r} has no class {class_name!r}"
        )
    return cls


def _missing_dependency(module_name: str, exc: ImportError) -> bool:
    """Whether the module was found but a package it imports is missing (its own guard's
    message then says what to install; PYTHONPATH is not the fix)."""
    missing = exc.name
    return bool(missing) and not (module_name == missing or module_name.startswith(f"{missing}."))


def load_env_class(path: str) -> type:
    """The environment class ``path`` names, imported from ``PYTHONPATH``.

    Raises:
        EnvConfigError: no such module or class, or the class lacks ``reset`` / ``step``.
    """
    cls = import_class(path)
    missing = [name for name in ("reset", "step") if not callable(getattr(cls, name, None))]
    if missing:
        raise EnvConfigError(
            f"env.cls {path!r}: the class has no {' or '.join(missing)} method (an environment "
            "has reset(record) -> str and step(action) -> (observation, reward, done))"
        )
    return cls


def stop_strings(cls: type, path: str) -> tuple[str, ...]:
    """The turn-ending texts ``cls`` declares (``stop_strings``; none by default).

    Raises:
        EnvConfigError: the attribute is not a tuple or list of non-empty strings.
    """
    value = getattr(cls, "stop_strings", ())
    if not isinstance(value, tuple | list) or not all(isinstance(s, str) and s for s in value):
        raise EnvConfigError(
            f"env.cls {path!r}: stop_strings must be a tuple of non-empty strings, "
            f"got {value!r:.80}"
        )
    return tuple(value)


def max_concurrent_steps(cls: type, path: str) -> int | None:
    """How many steps of ``cls`` one worker runs at once (``max_concurrent_steps``; None:
    no limit).

    Raises:
        EnvConfigError: the attribute is neither None nor a positive integer.
    """
    value = getattr(cls, "max_concurrent_steps", None)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise EnvConfigError(
            f"env.cls {path!r}: max_concurrent_steps must be None or an integer >= 1, "
            f"got {value!r:.80}"
        )
    return value


def make_env(path: str, kwargs: dict[str, Any]) -> Any:
    """One episode's instance: ``cls(**kwargs)`` of the class ``path`` names.

    Raises:
        EnvConfigError: the class cannot be loaded or refuses ``kwargs``.
    """
    cls = load_env_class(path)
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise EnvConfigError(f"env.cls {path!r} refuses env.kwargs {kwargs!r}: {exc}") from None


async def call_env(method: Any, *args: Any) -> Any:
    """Run an environment method: awaited when it is a coroutine function, else on a thread
    (so a blocking ``step`` holds up its own episode, not the worker's event loop)."""
    return (await timed_call_env(method, *args))[0]


async def timed_call_env(method: Any, *args: Any) -> tuple[Any, float]:
    """:func:`call_env`, and the seconds the method itself ran: timed on the thread that
    runs a plain method, so the wait for a free thread is not counted."""
    if inspect.iscoroutinefunction(method):
        start = time.perf_counter()
        return await method(*args), time.perf_counter() - start
    result, seconds = await asyncio.to_thread(_timed, method, *args)
    if inspect.isawaitable(result):  # a sync wrapper that hands back a coroutine
        start = time.perf_counter()
        result = await result
        seconds += time.perf_counter() - start
    return result, seconds


def _timed(method: Any, *args: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    return method(*args), time.perf_counter() - start


def checked_reset(result: Any, path: str) -> str:
    """``reset``'s return value if it is text.

    Raises:
        EnvironmentFailed: it is not.
    """
    if not isinstance(result, str):
        raise EnvironmentFailed(
            f"environment {path}: reset must return the episode's starting text (str), "
            f"got {type(result).__name__}"
        )
    return result


def checked_step(result: Any, path: str) -> StepResult:
    """``step``'s return value as ``(str, float, bool)``.

    Raises:
        EnvironmentFailed: it is not a triple of text, a number and a flag.
    """
    ok = isinstance(result, tuple | list) and len(result) == 3
    if ok:
        observation, reward, done = result
        ok = (
            isinstance(observation, str)
            and isinstance(reward, int | float)
            and not isinstance(reward, bool)
            and isinstance(done, bool | int)
        )
    if not ok:
        raise EnvironmentFailed(
            f"environment {path}: step must return (observation: str, reward: float, "
            f"done: bool), got {result!r:.80}"
        )
    return observation, float(reward), bool(done)
