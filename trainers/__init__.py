"""Top layer: RL algorithms (one file each: grpo, ppo, dapo), the CLI and the iteration loop.

The maths (``trainers.core``, the algorithm files, ``trainers.kl_control``) is plain torch,
testable on CPU without Ray, Megatron or mindrl; ``trainers.registry`` finds an algorithm
by name.
"""
