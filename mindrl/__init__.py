"""mindrl: RL post-training for LLMs with a distributed transfer dock and allgather-swap.

``import mindrl`` needs only torch, ray and tensordict; heavier pieces (Megatron-core,
transformers, vLLM) are imported by the modules that use them.

Importing it turns Ray's usage statistics off for every Ray the process starts (runs,
tests, benchmarks) unless the user set ``RAY_USAGE_STATS_ENABLED`` themselves: air-gapped
clusters are common where this runs, and nothing should try to phone home from them (as
W&B runs offline by default, docs/guide/running.md).
"""

import os

__version__ = "0.1.0"

#: Ray reads this variable when a cluster starts; its processes inherit it.
RAY_USAGE_STATS = "RAY_USAGE_STATS_ENABLED"
os.environ.setdefault(RAY_USAGE_STATS, "0")
