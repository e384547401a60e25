"""Typed configuration: schema (dataclasses), YAML + override loader, cross-field checks."""

from mindrl.config.loader import ConfigError, load_config
from mindrl.config.schema import (
    AlgorithmConfig,
    CheckpointConfig,
    DataConfig,
    DockConfig,
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
from mindrl.config.validate import data_parallel_size, expert_data_parallel_size

__all__ = [
    "AlgorithmConfig",
    "CheckpointConfig",
    "ConfigError",
    "DataConfig",
    "DockConfig",
    "LoggingConfig",
    "MindRLConfig",
    "ModelConfig",
    "OptimConfig",
    "ParallelConfig",
    "ResourcesConfig",
    "RewardConfig",
    "RoleConfig",
    "RolloutConfig",
    "data_parallel_size",
    "expert_data_parallel_size",
    "load_config",
]
