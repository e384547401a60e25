"""Nothing phones home: every Ray the project starts has its usage statistics off unless
the user turned them on (air-gapped clusters are common where mindrl runs)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mindrl import RAY_USAGE_STATS


def environment_after_import(**set_by_user: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != RAY_USAGE_STATS} | set_by_user
    code = f"import os, mindrl; print(os.environ.get({RAY_USAGE_STATS!r}))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    return out.stdout.strip()


def test_importing_mindrl_turns_rays_usage_statistics_off():
    assert environment_after_import() == "0"


def test_a_user_who_turned_them_on_keeps_them_on():
    assert environment_after_import(**{RAY_USAGE_STATS: "1"}) == "1"


@pytest.mark.ray
def test_the_shared_ray_sessions_workers_run_with_usage_statistics_off(ray_cluster):
    import ray
    from ray._common.usage import usage_lib

    @ray.remote(num_cpus=0)
    def enabled_on_the_worker() -> tuple[str | None, bool]:
        return os.environ.get(RAY_USAGE_STATS), usage_lib.usage_stats_enabled()

    assert ray.get(enabled_on_the_worker.remote()) == ("0", False)
