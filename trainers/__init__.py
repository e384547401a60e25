"""Top layer: the RL algorithms, the CLI and the run driver (``trainers.driver``).

One file per algorithm; ``trainers.registry`` lists the nine ``--trainer`` runs:

* online, group-relative: ``grpo`` (grpo.py), ``dapo`` (dapo.py: dynamic sampling,
  decoupled clip, overlong shaping), ``dr_grpo`` (dr_grpo.py), ``gspo`` (gspo.py:
  sequence-level ratios), ``rloo`` (rloo.py: leave-one-out baseline);
* online, with a critic: ``ppo`` (ppo.py: GAE), ``pf_ppo`` (pf_ppo.py: policy filtration);
* online, no groups and no critic: ``reinforce_pp`` (reinforce_pp.py);
* offline pairs: ``dpo`` (dpo.py, IPO as an option).

The maths (``trainers.core``, the algorithm files, ``trainers.kl_control``) is plain torch,
testable on CPU without Ray, Megatron or mindrl; ``trainers.registry`` finds an algorithm
by name.
"""
