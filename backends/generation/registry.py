"""Engines by name: ``get_engine_class("hf" | "vllm")``.

Adding an engine is one file (a :class:`GenerationEngine` subclass declaring its name and
capabilities) and one line in :data:`ENGINES`. An engine module imports its library when
an engine starts, so its capabilities read everywhere (a dry run of a vLLM recipe on a
laptop) and a missing vLLM only fails when the ``vllm`` engine is built.
"""

from __future__ import annotations

import importlib
import importlib.util

from backends.generation.base import GenerationEngine

#: name -> "module:class" of the engine, in the order ``rollout.engine`` lists them.
ENGINES: dict[str, str] = {
    "vllm": "backends.generation.vllm_engine:VLLMGenerationEngine",
    "hf": "backends.generation.hf_engine:HFGenerationEngine",
}


class EngineUnavailableError(RuntimeError):
    """The requested engine is known but its library is not installed here."""


def engine_class(name: str) -> type[GenerationEngine]:
    """The engine class registered as ``name``, to read its capabilities (its library need
    not be installed).

    Raises:
        ValueError: ``name`` is not a known engine (the message lists the known ones).
    """
    if name not in ENGINES:
        raise ValueError(f"unknown generation engine '{name}'; known: {', '.join(sorted(ENGINES))}")
    module_name, class_name = ENGINES[name].split(":")
    return getattr(importlib.import_module(module_name), class_name)


def is_installed(name: str) -> bool:
    """Whether the library engine ``name`` needs is installed here."""
    library = engine_class(name).library
    return library is None or importlib.util.find_spec(library) is not None


def available_engines() -> list[str]:
    """Names of the engines whose libraries are installed in this environment."""
    return [name for name in ENGINES if is_installed(name)]


def engines_with(capability: str) -> list[str]:
    """Names of the engines that declare ``capability`` (a class attribute)."""
    return [name for name in ENGINES if getattr(engine_class(name), capability)]


def engine_name(requested: str) -> str:
    """``auto`` -> the installed engine ranked highest (vllm where it is installed, else
    the transformers engine); any other name as it is."""
    if requested != "auto":
        return requested
    return max(available_engines(), key=lambda name: engine_class(name).auto_rank)


def get_engine_class(name: str) -> type[GenerationEngine]:
    """The engine class registered as ``name``, ready to build.

    Raises:
        ValueError: ``name`` is not a known engine (the message lists the known ones).
        EngineUnavailableError: its library is missing (the message says how to install).
    """
    cls = engine_class(name)
    if not is_installed(name):
        raise EngineUnavailableError(
            f"generation engine '{name}' needs the '{cls.library}' package: {cls.install_hint}"
        )
    return cls
