"""A flat reference of every config key: dotted name, type, default and doc."""

from __future__ import annotations

import dataclasses
import typing

from mindrl.config.fields import config_key
from mindrl.config.schema import MindRLConfig


def config_reference(cls: type = MindRLConfig, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """``(dotted key, type, default, doc)`` for every leaf field, in declaration order."""
    rows = []
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        key = f"{prefix}{config_key(field)}"
        if dataclasses.is_dataclass(hint):
            rows += config_reference(hint, key + ".")
            continue
        default = (
            field.default_factory()
            if field.default_factory is not dataclasses.MISSING
            else field.default
        )
        type_text = (
            str(hint).replace("typing.", "") if not isinstance(hint, type) else hint.__name__
        )
        rows.append((key, type_text, repr(default), field.metadata.get("doc", "")))
    return rows


def render_reference() -> str:
    width = max(len(key) for key, *_ in config_reference())
    return "\n".join(
        f"{key:<{width}}  {doc} [{type_text}, default {default}]"
        for key, type_text, default, doc in config_reference()
    )
