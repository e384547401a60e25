"""``option()``: a dataclass field that carries its own documentation and bounds.

Every config field is declared with :func:`option` so one place holds the default, the
one-line doc shown by ``mindrl-train --help-config``, and the checks the loader applies
(range, choices). Dataclasses have no per-field docstrings; field metadata does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any


def option(
    default: Any = dataclasses.MISSING,
    doc: str = "",
    *,
    factory: Callable[[], Any] | None = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    choices: Sequence[Any] | Callable[[], Sequence[Any]] | None = None,
    key: str | None = None,
) -> Any:
    """Declare a config field with its doc string and validation bounds; ``key``: its name
    in YAML and overrides when that is no Python name (``checkpoint.async``); ``choices``:
    the allowed values, or a function giving them where a registry holds them (read when
    a value is checked, so declaring the schema imports no registry)."""
    metadata = {"doc": doc, "ge": ge, "gt": gt, "le": le, "choices": choices, "key": key}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def section(cls: type) -> Any:
    """A nested config section defaulting to its dataclass defaults."""
    return dataclasses.field(default_factory=cls, metadata={"doc": (cls.__doc__ or "").strip()})


def config_key(field: dataclasses.Field) -> str:
    """A field's name in YAML and overrides."""
    return field.metadata.get("key") or field.name
