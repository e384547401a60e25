"""Typed configuration: schema (dataclasses), YAML + override loader, cross-field checks."""

from mindrl.config.loader import ConfigError, load_config
from mindrl.config.schema import (
    AlgorithmConfig,
    CheckpointConfig,
    DataConfig,
    DockConfig,
    EnvConfig,
    LoggingConfig,
    MindRLConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    ResourcesConfig,
    RewardConfig,
    RoleConfig,
    RolloutConfig,
)

__all__ = [
    "AlgorithmConfig",
    "CheckpointConfig",
    "ConfigError",
    "DataConfig",
    "DockConfig",
    "EnvConfig",
    "LoggingConfig",
    "MindRLConfig",
    "ModelConfig",
    "OptimConfig",
    "ParallelConfig",
    "ResourcesConfig",
    "RewardConfig",
    "RoleConfig",
    "RolloutConfig",
    "load_config",
]
