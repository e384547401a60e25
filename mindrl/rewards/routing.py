"""The run's rewards from the config: its functions by name and each domain's route.

A sample's domain (``data.domain_key`` of its row, ``default`` without one) picks its
route, a list of ``(function, weight)``; its reward is the weighted sum over the functions
that did not abstain. With no ``reward.routes`` the verifiers of ``reward.verifiers`` are
every domain's route, summed with weight 1 as they always were, and run in the reward
worker's own process as before: they are the project's own pure functions of two strings.
Everything else a route names runs in the worker's process pool (synchronous functions) or
on its event loop (``async def``), under its timeout (mindrl/rewards/pool.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from mindrl.data.records import DEFAULT_DOMAIN
from mindrl.rewards.functions import (
    BUILTINS,
    FunctionSpec,
    RewardFunctionError,
    load_function,
    parse_function_spec,
)

#: The verifiers reward.verifiers names: built-ins run in the reward worker's own process.
VERIFIER_BUILTINS = ("synthetic", "exact", "math", "math_format")
#: Every domain's route when reward.routes is empty: the verifiers.
ANY_DOMAIN = "*"
ROUTE_KEYS = ("fn", "weight")


class RewardConfigError(ValueError):
    """A ``reward`` section that cannot score; the message is one line."""


@dataclass(frozen=True)
class Route:
    """One function of a domain's route and its weight in the sum."""

    function: str
    weight: float = 1.0


@dataclass(frozen=True)
class RewardSpec:
    """What the reward stage computes.

    Attributes:
        functions: every function a route names, by name (builtins named by their name).
        routes: domain -> its route; :data:`ANY_DOMAIN` is every domain's (the verifiers).
        inline: the functions the worker calls in its own process (the verifiers).
    """

    functions: Mapping[str, FunctionSpec]
    routes: Mapping[str, tuple[Route, ...]]
    inline: frozenset[str]

    def route(self, domain: str) -> tuple[Route, ...] | None:
        """The route of ``domain``; None where the config gives it none."""
        return self.routes.get(domain, self.routes.get(ANY_DOMAIN))

    def unrouted(self, domains: Sequence[str]) -> list[str]:
        """Those of ``domains`` with no route, in order, once each."""
        return [d for d in dict.fromkeys(domains) if self.route(d) is None]

    @property
    def uses_groups(self) -> bool:
        """A function scores a prompt's responses together (its reward stage claims whole
        groups)."""
        return any(spec.group for spec in self.functions.values())

    def pooled(self) -> list[FunctionSpec]:
        """The functions that run in the process pool or on its loop."""
        return [spec for name, spec in self.functions.items() if name not in self.inline]


def reward_spec(
    verifiers: Sequence[str],
    functions: Mapping[str, Any],
    routes: Mapping[str, Any],
    judge: Mapping[str, Any] | None = None,
) -> RewardSpec:
    """The spec of a ``reward`` section (its ``verifiers``, ``functions``, ``routes`` and
    ``judge`` settings, which a ``judge`` function's kwargs extend).

    Raises:
        RewardConfigError: one line naming the key at fault: an entry that does not parse,
            a route naming an unknown function, a bad weight, a function in no route.
    """
    try:
        declared = {name: parse_function_spec(name, raw) for name, raw in functions.items()}
    except RewardFunctionError as exc:
        raise RewardConfigError(str(exc)) from None
    if not routes:
        unused = sorted(declared)
        if unused:
            raise RewardConfigError(
                f"reward.functions.{unused[0]} is in no route: name it in reward.routes "
                "(e.g. reward.routes: {default: [{fn: " + unused[0] + "}]})"
            )
        return _verifier_spec(verifiers)
    parsed = {domain: _route(domain, entries) for domain, entries in routes.items()}
    named = {route.function for route in _flat(parsed)}
    unused = sorted(set(declared) - named)
    if unused:
        raise RewardConfigError(
            f"reward.functions.{unused[0]} is in no route of reward.routes "
            f"({', '.join(parsed)}); add it to one or remove it"
        )
    used = {name: _function(name, declared, judge) for name in sorted(named)}
    inline = frozenset(n for n in used if n in VERIFIER_BUILTINS and n not in declared)
    return RewardSpec(used, parsed, inline)


def reward_spec_of(section: Any) -> RewardSpec:
    """The spec of the config's ``reward`` section (a :class:`RewardConfig`).

    Raises:
        RewardConfigError: as :func:`reward_spec`.
    """
    return reward_spec(section.verifiers, section.functions, section.routes, section.judge)


def _verifier_spec(verifiers: Sequence[str]) -> RewardSpec:
    unknown = [v for v in verifiers if v not in VERIFIER_BUILTINS]
    if unknown:
        known = ", ".join(sorted(VERIFIER_BUILTINS))
        raise RewardConfigError(
            f"reward.verifiers: unknown verifier {unknown[0]!r}; known: {known}"
        )
    functions = {v: FunctionSpec(v, BUILTINS[v]) for v in dict.fromkeys(verifiers)}
    route = tuple(Route(v) for v in verifiers)  # as listed: a verifier named twice counts twice
    return RewardSpec(functions, {ANY_DOMAIN: route}, frozenset(functions))


def _route(domain: str, entries: Any) -> tuple[Route, ...]:
    where = f"reward.routes.{domain}"
    if not isinstance(entries, list) or not entries:
        raise RewardConfigError(
            f"{where} must be a non-empty list of {{fn: NAME, weight: w}}, got {entries!r}"
        )
    return tuple(_entry(f"{where}[{i}]", entry) for i, entry in enumerate(entries))


def _entry(where: str, entry: Any) -> Route:
    if isinstance(entry, str):  # a bare name: weight 1
        entry = {"fn": entry}
    if not isinstance(entry, Mapping) or "fn" not in entry:
        raise RewardConfigError(f"{where} must be {{fn: NAME, weight: w}}, got {entry!r}")
    unknown = [str(key) for key in entry if key not in ROUTE_KEYS]
    if unknown:
        raise RewardConfigError(f"{where}: unknown key {unknown[0]!r} (known: fn, weight)")
    weight = entry.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight):
        raise RewardConfigError(f"{where}: weight must be a finite number, got {weight!r}")
    return Route(str(entry["fn"]), float(weight))


def _flat(routes: Mapping[str, tuple[Route, ...]]) -> list[Route]:
    return [route for entries in routes.values() for route in entries]


def _function(
    name: str, declared: Mapping[str, FunctionSpec], judge: Mapping[str, Any] | None
) -> FunctionSpec:
    """A route's function: its ``reward.functions`` entry, else the builtin of that name;
    the judge's kwargs are ``reward.judge`` under the entry's own."""
    spec = declared.get(name)
    if spec is None:
        if name not in BUILTINS:
            known = ", ".join(sorted({*declared, *BUILTINS}))
            raise RewardConfigError(
                f"reward.routes names function {name!r}, which is neither in reward.functions "
                f"nor a builtin; known: {known}"
            )
        spec = FunctionSpec(name, BUILTINS[name])
    if spec.target == BUILTINS["judge"]:
        spec = replace(spec, kwargs={**(judge or {}), **spec.kwargs})
    return spec


def check_functions(spec: RewardSpec) -> None:
    """Import every function and check it takes its call; the sandbox and the judge's
    settings where a route uses them: what start-up (and ``--dry-run``) refuses.

    Raises:
        RewardConfigError: one line naming the function and what is wrong.
    """
    for function in spec.functions.values():
        try:
            load_function(function)
        except RewardFunctionError as exc:
            raise RewardConfigError(str(exc)) from None
        if function.target == BUILTINS["judge"]:
            _check_judge(function)
        if function.target == BUILTINS["code_tests"]:
            _check_sandbox(function)


def _check_judge(function: FunctionSpec) -> None:
    from mindrl.rewards.judge import judge_settings

    try:
        judge_settings(**function.kwargs)
    except (TypeError, ValueError) as exc:
        raise RewardConfigError(f"reward.functions.{function.name}: {exc}") from None


def _check_sandbox(function: FunctionSpec) -> None:
    from mindrl.rewards.sandbox import SandboxUnavailable, check_sandbox_available

    try:
        check_sandbox_available()
    except SandboxUnavailable as exc:
        raise RewardConfigError(f"reward.functions.{function.name} (code_tests): {exc}") from None


def served_judge(spec: RewardSpec, judge: Mapping[str, Any]) -> bool:
    """Whether the run serves ``reward.judge.model`` itself: a route uses the judge with
    the section's model (a ``model`` a function's own kwargs name is loaded by each
    reward worker)."""
    model = judge.get("model")
    return bool(model) and any(
        f.target == BUILTINS["judge"] and f.kwargs.get("model") == model
        for f in spec.functions.values()
    )


def unrouted_problem(spec: RewardSpec, domains: Sequence[str], uids: Sequence[str]) -> str | None:
    """One line naming the first domain of the data (``domains``, the rows' in order, with
    their ``uids``) that has no route and three of its rows; None when every one has."""
    missing = spec.unrouted(domains)
    if not missing:
        return None
    domain = missing[0]
    rows = [uid for uid, d in zip(uids, domains, strict=True) if d == domain][:3]
    hint = "" if domain != DEFAULT_DOMAIN else " (rows without data.domain_key)"
    return (
        f"the data holds domain {domain!r}{hint} (rows {', '.join(rows)}) but reward.routes "
        f"gives it no route (routes: {', '.join(spec.routes)}); add reward.routes.{domain}"
    )


def reward_problems(config: Any) -> list[str]:
    """The problems of a run config's rewards (a :class:`MindRLConfig`): a section that does
    not parse, a function that does not import or take its call, a sandbox or judge that
    cannot work; none for a run that scores nothing itself (offline pairs, an environment's
    rewards)."""
    if config.env.enabled:
        return []
    try:
        check_functions(reward_spec_of(config.reward))
    except RewardConfigError as exc:
        return [str(exc)]
    return []
