"""Loading a :class:`MindRLConfig` from YAML plus dotted overrides, with clear errors.

Every problem found is collected and raised together as one :class:`ConfigError`, each
a single line naming the file and the dotted key, e.g.
``configs/x.yaml: actor.optim.lr: expected a number, got 'fast'``.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from mindrl.config.fields import config_key
from mindrl.config.schema import MindRLConfig, ModelConfig

if TYPE_CHECKING:
    from mindrl.config.compat import AlgorithmTraits


class ConfigError(ValueError):
    """One or more problems with a configuration, each a one-line message."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


_MISSING = object()
#: A recipe's value that the user must give (``model: {hf_path: ???}``): a run refuses to
#: start until an override or the recipe sets it, naming the key.
REQUIRED = "???"
#: ``model.tokenizer: auto`` follows the weights.
AUTO_TOKENIZER = "auto"

#: The keys of the reference's and critic's sections that take the actor's value unless the
#: recipe sets them: the training layout and micro-batching. A scoring or value model of the
#: policy's architecture usually shards as the policy does, and a recipe that states the
#: actor's layout once stays right whichever roles the trainer places.
INHERITED_FROM_ACTOR: tuple[tuple[str, ...], ...] = (
    ("parallel", "tp"),
    ("parallel", "pp"),
    ("parallel", "cp"),
    ("parallel", "ep"),
    ("parallel", "etp"),
    ("parallel", "first_stage_layers"),
    ("micro_batch_size",),
    ("max_tokens_per_micro_batch",),
)
INHERITING_ROLES = ("reference", "critic")


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    algorithm: AlgorithmTraits | None = None,
) -> MindRLConfig:
    """Build the config from a YAML file (or the defaults) and ``key=value`` overrides,
    checked for ``algorithm`` (the run's; see :func:`mindrl.config.validate.validate_config`).

    Raises:
        ConfigError: unreadable file, invalid YAML, unknown keys, wrong types, values
            out of range, or impossible layouts (see :mod:`mindrl.config.validate`).
    """
    from mindrl.config.validate import validate_config

    origin = str(path) if path is not None else "<defaults>"
    raw = read_yaml(path) if path is not None else {}
    problems: list[str] = []
    for item in overrides or []:
        apply_override(raw, item, problems)
    inherit_actor_layout(raw)
    problems += [f"{origin}: {key}" for key in required_problems(raw)]
    config = build(MindRLConfig, raw, "", problems, origin)
    if problems:
        raise ConfigError(problems)
    config.model = checkpoint_model(resolved_tokenizer(config.model), origin)
    problems = [f"{origin}: {p}" for p in validate_config(config, algorithm)]
    if problems:
        raise ConfigError(problems)
    return config


def required_problems(raw: dict[str, Any], prefix: str = "") -> list[str]:
    """One line per key the recipe left :data:`REQUIRED` and no override set."""
    problems = []
    for key, value in raw.items():
        if isinstance(value, dict):
            problems += required_problems(value, f"{prefix}{key}.")
        elif value == REQUIRED:
            dotted = f"{prefix}{key}"
            problems.append(
                f"{dotted}: this recipe leaves it to you; give it on the command line "
                f"({dotted}=VALUE) or in a copy of the recipe"
            )
    return problems


def resolved_tokenizer(model: ModelConfig) -> ModelConfig:
    """``model.tokenizer: auto`` as the tokenizer of the weights: the HF folder's, the GGUF
    package's, or the built-in one of a model made in code."""
    if model.tokenizer != AUTO_TOKENIZER:
        return model
    if model.hf_path:
        tokenizer = model.hf_path
    elif model.gguf_package:
        tokenizer = f"gguf:{model.gguf_package}"
    else:
        tokenizer = "builtin:tiny"
    return dataclasses.replace(model, tokenizer=tokenizer)


def checkpoint_model(model: ModelConfig, origin: str) -> ModelConfig:
    """The model section as the checkpoint it names describes it (validated as such)."""
    if not model.hf_path:  # no checkpoint: the section is the architecture
        return model
    from mindrl.config.specs import ModelSetupError, with_checkpoint_architecture

    try:
        return with_checkpoint_architecture(model)
    except ModelSetupError as exc:
        raise ConfigError([f"{origin}: model.hf_path: {exc}"]) from None


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Parse a YAML mapping, turning every failure into a one-line ConfigError."""
    file = Path(path)
    text = read_text(file)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError([f"{file}: invalid YAML{where}: {problem}"]) from None
    if data is None:
        # An empty (or comments-only) file is almost always a mistake (a truncated copy,
        # a wrong path); running silently on the defaults would hide it.
        raise ConfigError(
            [f"{file}: config file is empty (write at least one section, e.g. 'iterations: 10')"]
        )
    if not isinstance(data, dict):
        kind = "a list" if isinstance(data, list) else f"a single value ({data!r:.40})"
        raise ConfigError(
            [f"{file}: top level must be a mapping of sections (e.g. 'actor:'), got {kind}"]
        )
    return data


def read_text(file: Path) -> str:
    """The file's text as UTF-8, or a one-line ConfigError saying why it cannot be read."""
    if file.is_dir():
        raise ConfigError([f"{file}: is a directory, not a config file (pass --config FILE.yaml)"])
    if not file.is_file():
        raise ConfigError([f"{file}: config file not found (pass an existing --config FILE)"])
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise ConfigError([f"{file}: cannot read the config file: {exc.strerror}"]) from None
    # A NUL byte is valid UTF-8 but never in a text file: name it as binary up front.
    bad = raw.find(b"\x00")
    if bad < 0:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad = exc.start
    raise ConfigError(
        [
            f"{file}: not a UTF-8 text file (byte {bad} is 0x{raw[bad]:02x});"
            " --config takes a YAML recipe"
        ]
    )


def apply_override(raw: dict[str, Any], item: str, problems: list[str]) -> None:
    """Set ``a.b.c=value`` inside the raw mapping; the value is parsed as YAML."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        problems.append(f"override '{item}': expected dotted.key=value (e.g. actor.optim.lr=1e-6)")
        return
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError:
        value = text
    node = raw
    parts = key.strip().split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            problems.append(f"override '{item}': '{part}' is a value, not a section")
            return
        node = child
    node[parts[-1]] = value


def inherit_actor_layout(raw: dict[str, Any]) -> None:
    """Give the reference and the critic the actor's :data:`INHERITED_FROM_ACTOR` keys
    that the recipe and the overrides left unset (sections that are not mappings are left
    for :func:`build` to refuse)."""
    actor = raw.get("actor")
    if not isinstance(actor, dict):
        return
    for role in INHERITING_ROLES:
        section = raw.setdefault(role, {})
        if not isinstance(section, dict):
            continue
        for path in INHERITED_FROM_ACTOR:
            value = _lookup(actor, path)
            target = _section_at(section, path[:-1])
            if value is not _MISSING and target is not None:
                target.setdefault(path[-1], value)


def _lookup(raw: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = raw
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _section_at(raw: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any] | None:
    node = raw
    for part in path:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            return None
    return node


def build(cls: type, raw: Any, prefix: str, problems: list[str], origin: str) -> Any:
    """Instantiate dataclass ``cls`` from ``raw``, appending problems instead of raising."""
    if not isinstance(raw, dict):
        problems.append(
            f"{origin}: {prefix.rstrip('.') or 'top level'}: expected a section (mapping)"
        )
        return cls()
    hints = typing.get_type_hints(cls)
    fields = {config_key(f): f for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in fields:
            problems.append(f"{origin}: {prefix}{key}: unknown key{did_you_mean(str(key), fields)}")
    values = {}
    for key, field in fields.items():
        if key not in raw:
            continue
        dotted = f"{prefix}{key}"
        hint = hints[field.name]
        if dataclasses.is_dataclass(hint):
            values[field.name] = build(hint, raw[key], dotted + ".", problems, origin)
            continue
        value = coerce(raw[key], hint)
        if value is _MISSING:
            problems.append(f"{origin}: {dotted}: expected {type_name(hint)}, got {raw[key]!r}")
            continue
        bound = check_bounds(value, field.metadata)
        if bound:
            problems.append(f"{origin}: {dotted}: {bound}")
            continue
        values[field.name] = value
    return cls(**values)


def did_you_mean(key: str, known: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else f" (known: {', '.join(sorted(known))})"


def coerce(value: Any, hint: Any) -> Any:
    """``value`` converted to ``hint`` where that is lossless, else ``_MISSING``."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(hint):
            return None
        for arg in typing.get_args(hint):
            if arg is not type(None) and (result := coerce(value, arg)) is not _MISSING:
                return result
        return _MISSING
    if origin is list:
        if not isinstance(value, list):
            return _MISSING
        (item_hint,) = typing.get_args(hint)
        items = [coerce(v, item_hint) for v in value]
        return _MISSING if any(i is _MISSING for i in items) else items
    if origin is dict:  # keyword arguments handed on as they are (env.kwargs)
        named = isinstance(value, dict) and all(isinstance(k, str) for k in value)
        return value if named else _MISSING
    if hint is bool:
        return value if isinstance(value, bool) else _MISSING
    if hint is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _MISSING
    if hint is float:
        if isinstance(value, str):
            # YAML 1.1 reads `1e-6` (no dot) as a string; accept what float() accepts.
            try:
                return float(value)
            except ValueError:
                return _MISSING
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return float(value) if ok else _MISSING
    if hint is str:
        return value if isinstance(value, str) else _MISSING
    return _MISSING


def type_name(hint: Any) -> str:
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(
            "null" if a is type(None) else type_name(a) for a in typing.get_args(hint)
        )
    if typing.get_origin(hint) is dict:
        return "a mapping of names to values"
    if typing.get_origin(hint) is list:
        item = type_name(typing.get_args(hint)[0]).removeprefix("a ").removeprefix("an ")
        return f"a list of {item}s"
    return names.get(hint, str(hint))


def check_bounds(value: Any, meta: typing.Mapping[str, Any]) -> str | None:
    """A one-line reason ``value`` breaks the field's bounds, or None."""
    choices = meta.get("choices")
    if callable(choices):  # a registry's names (model families, generation engines)
        choices = choices()
    # A list field with choices (logging.backends) takes each item from them.
    for item in value if isinstance(value, list) else [value]:
        if choices is not None and item not in choices:
            shown = ", ".join("null" if c is None else str(c) for c in choices)
            return f"{item!r} is not one of: {shown}"
    if value is None or not isinstance(value, int | float):
        return None
    for name, fails, word in (
        ("ge", lambda v, b: v < b, ">="),
        ("gt", lambda v, b: v <= b, ">"),
        ("le", lambda v, b: v > b, "<="),
    ):
        bound = meta.get(name)
        if bound is not None and fails(value, bound):
            return f"must be {word} {bound}, got {value}"
    return None
