"""A flat reference of every config key: dotted name, type, default and doc."""

from __future__ import annotations

import dataclasses
import typing

from mindrl.config.fields import config_key
from mindrl.config.loader import INHERITED_FROM_ACTOR, INHERITING_ROLES
from mindrl.config.schema import MindRLConfig

#: Keys whose default is the actor's value (mindrl/config/loader.py, inherit_actor_layout).
INHERITED_KEYS = {
    f"{role}.{'.'.join(path)}": f"actor.{'.'.join(path)}"
    for role in INHERITING_ROLES
    for path in INHERITED_FROM_ACTOR
}


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
        shown = INHERITED_KEYS.get(key, repr(default))  # the actor's value unless set
        rows.append((key, type_text, shown, field.metadata.get("doc", "")))
    return rows


def render_reference() -> str:
    width = max(len(key) for key, *_ in config_reference())
    return "\n".join(
        f"{key:<{width}}  {doc} [{type_text}, default {default}]"
        for key, type_text, default, doc in config_reference()
    )
