"""Generation engines for rollouts: one interface, engines found by name.

Example:
    >>> from backends.generation import EngineConfig, SamplingParams, get_engine_class
    >>> engine = get_engine_class("hf")(EngineConfig(model="path/to/hf_model"))
    >>> results = engine.generate([[1, 2, 3]], SamplingParams(n=4, max_tokens=32))
"""

from backends.generation.base import (
    EngineConfig,
    EngineStateError,
    FinishReason,
    GenerationEngine,
    GenerationResult,
    InvalidPromptError,
    SamplingParams,
)
from backends.generation.registry import (
    EngineUnavailableError,
    available_engines,
    get_engine_class,
)

__all__ = [
    "EngineConfig",
    "EngineStateError",
    "EngineUnavailableError",
    "FinishReason",
    "GenerationEngine",
    "GenerationResult",
    "InvalidPromptError",
    "SamplingParams",
    "available_engines",
    "get_engine_class",
]
