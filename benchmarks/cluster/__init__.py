"""A cluster of namespaced Ray nodes behind shaped links on one machine (netns.py), and
what runs on it: the dock against the centralized buffer as nodes are added
(linearity.py), a GRPO run across 4 nodes (grpo.py), a link check (probe.py)."""
