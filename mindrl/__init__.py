"""mindrl: RL post-training for LLMs with a distributed transfer dock and allgather-swap.

``import mindrl`` needs only torch, ray and tensordict; heavier pieces (Megatron-core,
transformers, vLLM) are imported by the modules that use them.
"""

__version__ = "0.1.0"
