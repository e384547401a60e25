"""The judge model a run serves itself (``reward.judge.model``), in a process of its own.

Every reward worker's ``judge`` calls ask this one actor (mindrl/rewards/judge.py,
``serve_model``), so the judge's weights are in memory once, not once per reward worker,
and its batches take the requests of every worker together. It generates with the
project's engines: ``rollout.engine``'s choice (vLLM where installed with ``auto``, the
transformers engine on a CPU).
"""

from __future__ import annotations

import ray

from mindrl.rewards.judge import build_hf_generate, judge_settings


class JudgeServer:
    """One judge model, answering prompts with the judge's settings (``reward.judge``)."""

    def __init__(self, rank: int, size: int, settings: dict, engine: str) -> None:
        judge = judge_settings(**settings)
        self.folder = judge.model
        self._generate = build_hf_generate(
            judge.model, judge.max_tokens, judge.temperature, engine=engine
        )

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def generate(self, prompts: list[str]) -> list[str]:
        """The judge's reply to each prompt (already rendered with the rubric)."""
        return self._generate(prompts)
