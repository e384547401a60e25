"""Top layer: the RL algorithms (one file each; ``trainers.registry`` lists the ones
``--trainer`` runs), the CLI and the run driver (``trainers.driver``).

The maths (``trainers.core``, the algorithm files, ``trainers.kl_control``) is plain torch,
testable on CPU without Ray, Megatron or mindrl; ``trainers.registry`` finds an algorithm
by name.
"""
