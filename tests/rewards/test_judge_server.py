"""The judge model a run serves itself: one Ray actor holds it, and every reward worker's
judge asks that actor instead of loading the model (mindrl/workers/judge_server.py)."""

from __future__ import annotations

import asyncio

import pytest

from mindrl.rewards import judge as judge_module
from mindrl.rewards.inputs import RewardInput
from tests.rewards.test_judge import CHAT_TEMPLATE, save_rigged_judge, says_score_7_after

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]


def test_a_reward_workers_judge_asks_the_runs_judge_server(tmp_path, monkeypatch):
    import ray

    from mindrl.workers.judge_server import JudgeServer
    from mindrl.workers.reward import _asking

    save_rigged_judge(tmp_path, says_score_7_after("ASSISTANT"), CHAT_TEMPLATE)
    settings = {"model": str(tmp_path), "max_tokens": 6}
    server = ray.remote(JudgeServer).options(num_cpus=0).remote(0, 1, settings, "hf")
    asked = []

    def counted(prompts):
        asked.append(len(prompts))
        return _asking(server)(prompts)

    # The worker's process must never load the model itself.
    monkeypatch.setattr(judge_module, "build_hf_generate", lambda *a, **k: pytest.fail("loaded"))
    monkeypatch.setattr(judge_module, "_SERVED", {})
    judge_module.serve_model(str(tmp_path), counted)
    inputs = [RewardInput(f"q#{i}", "Grade it.", f"answer {i}", "7") for i in range(3)]

    async def scores():
        return await asyncio.gather(*(judge_module.judge(inp, **settings) for inp in inputs))

    try:
        assert asyncio.run(scores()) == [pytest.approx(0.7)] * 3
    finally:
        judge_module.close_judges()
        ray.kill(server)
    assert sum(asked) == 3
