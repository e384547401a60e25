"""The soak check (benchmarks/soak.py): memory per role stays flat after warm-up.

The real run trains the tiny config widened to ~12 MB of fp32 weights (~6 MB per TP
rank) for 30 iterations: a worker that kept one weight copy per iteration would grow
~6 MiB per iteration, six times the check's limit.
"""

from __future__ import annotations

import pytest

from benchmarks import soak

MIB_PER_WEIGHT_COPY = 5.6  # 2 layers of hidden 384 / ffn 768 + embeddings, fp32, over TP2


def records(host_series: list[float], role: str = "actor") -> list[dict]:
    return [
        {"iteration": i, "memory": {role: {"host_peak_mib": v, "device_peak_mib": 10.0}}}
        for i, v in enumerate(host_series)
    ]


def test_slope_is_the_least_squares_growth_per_iteration():
    assert soak.slope([5.0, 7.0, 9.0, 11.0]) == pytest.approx(2.0)
    assert soak.slope([3.0, 1.0, 3.0, 1.0, 3.0]) == pytest.approx(0.0)
    assert soak.slope([4.0]) == 0.0


def test_one_weight_copy_leaked_per_iteration_fails_the_check(capsys):
    warm_up = [300.0, 420.0, 500.0]
    leaking = [520.0 + MIB_PER_WEIGHT_COPY * i for i in range(27)]
    assert soak.report(records(warm_up + leaking), warmup=3, max_slope_mib=1.0) == 1
    assert "FAIL: actor host memory grows 5.60 MiB/iteration, 28.0% over 27" in (
        capsys.readouterr().out
    )


def test_a_slope_that_adds_up_to_less_than_the_growth_limit_is_noise():
    # 6.4 GiB workers wobbling by ~30 MiB over 5 iterations: a fitted 0.1 %, not a leak.
    history = records([4578.0, 6453.6, 6463.8, 6403.3, 6444.1, 6422.6, 6463.9])
    assert soak.report(history, warmup=2, max_slope_mib=1.0, max_growth=0.02) == 0
    (trend,) = [t for t in soak.memory_trends(history, 2) if t.key == "host_peak_mib"]
    assert trend.slope_mib == pytest.approx(1.95, abs=0.01)


def test_warm_up_growth_and_noise_pass_the_check(capsys):
    warm_up = [300.0, 420.0, 500.0]
    noisy = [520.0 + (3.0 if i % 2 else -3.0) for i in range(27)]
    assert soak.report(records(warm_up + noisy), warmup=3, max_slope_mib=1.0) == 0
    out = capsys.readouterr().out
    assert "actor host_peak_mib" in out and "FAIL" not in out


def test_too_few_iterations_after_warm_up_is_an_error():
    with pytest.raises(ValueError, match="run more iterations"):
        soak.memory_trends(records([1.0, 2.0, 3.0]), warmup=2)


@pytest.mark.long
@pytest.mark.ray
@pytest.mark.usefixtures("ray_cluster")
def test_a_30_iteration_tiny_run_keeps_every_roles_memory_flat(tmp_path, capsys):
    run_dir = soak.run_config(
        None,
        "grpo",
        30,
        [
            f"logging.dir={tmp_path / 'run'}",
            "logging.progress_bar=false",
            "logging.backends=[]",
            "model.hidden_size=384",
            "model.num_attention_heads=6",
            "model.num_kv_heads=6",
            "model.ffn_hidden_size=768",
        ],
    )
    history = soak.read_metrics(run_dir / "metrics.jsonl")
    assert soak.report(history, warmup=5, max_slope_mib=1.0) == 0, capsys.readouterr().out
    trends = {(t.role, t.key): t for t in soak.memory_trends(history, warmup=5)}
    assert {("actor", "host_peak_mib"), ("reward", "host_peak_mib")} <= set(trends)
    assert trends["actor", "device_peak_mib"].first_mib > MIB_PER_WEIGHT_COPY
