"""Curves to PNG, via the function and the mindrl-plot entry point."""

from __future__ import annotations

import struct

import pytest

from mindrl.metrics import MetricsLogger
from mindrl.metrics.plot import DPI, FIGURE_SIZE_IN, main, plot_metrics


def _png_size(path):
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", header[16:24])


@pytest.fixture
def run_dir(tmp_path):
    with MetricsLogger(tmp_path / "run", backends=()) as logger:
        for iteration in range(1, 21):
            logger.log(
                iteration,
                {"reward_mean": iteration / 20, "kl": 0.01, "response_length_mean": 3.0},
            )
    return tmp_path / "run"


@pytest.fixture
def drawn(monkeypatch) -> list:
    """Every (figure, axes) that ``plt.subplots`` makes during the test, in order."""
    import matplotlib.pyplot as plt

    made, subplots = [], plt.subplots
    monkeypatch.setattr(plt, "subplots", lambda *a, **k: made.append(subplots(*a, **k)) or made[-1])
    return made


def test_plot_writes_a_png_of_the_expected_size(run_dir, tmp_path):
    png = plot_metrics(run_dir / "metrics.jsonl", tmp_path / "out" / "curves.png")
    assert png.stat().st_size > 10_000
    expected = (round(FIGURE_SIZE_IN[0] * DPI), round(FIGURE_SIZE_IN[1] * DPI))
    assert _png_size(png) == expected


def test_cli_takes_a_run_folder_and_defaults_beside_the_jsonl(run_dir, capsys):
    assert main([str(run_dir)]) == 0
    png = run_dir / "metrics.png"
    assert capsys.readouterr().out.strip() == str(png)
    assert _png_size(png) == (1200, 350)


def test_cli_reports_a_missing_run_in_one_line(tmp_path, capsys):
    assert main([str(tmp_path / "none"), "-o", str(tmp_path / "x.png")]) == 2
    error = capsys.readouterr().err
    assert error.startswith("mindrl-plot: no metrics file") and error.count("\n") == 1
    assert not (tmp_path / "x.png").exists()


def test_a_preference_run_is_plotted_as_accuracy_margin_and_loss(tmp_path, drawn):
    with MetricsLogger(tmp_path / "dpo", backends=()) as logger:
        for iteration in range(5):
            record = {"preference_accuracy": iteration / 4, "reward_margin": 0.1, "loss": 0.6}
            logger.log(iteration, record)
    plot_metrics(tmp_path / "dpo" / "metrics.jsonl", tmp_path / "dpo.png")
    ((_, axes),) = drawn
    assert [axis.get_title() for axis in axes] == [
        "preference accuracy", "reward margin (chosen - rejected)", "loss",
    ]  # fmt: skip
    assert [len(axis.lines[0].get_xdata()) for axis in axes] == [5, 5, 5]


def test_validation_reward_is_drawn_over_the_training_reward(tmp_path, drawn):
    with MetricsLogger(tmp_path / "run", backends=()) as logger:
        for iteration in range(6):
            record = {"reward_mean": iteration / 5, "kl": 0.0, "response_length_mean": 2.0}
            if iteration % 3 == 2:
                record["val/reward_mean"] = iteration / 10
            logger.log(iteration, record)
    plot_metrics(tmp_path / "run" / "metrics.jsonl", tmp_path / "curves.png")
    ((_, (reward, kl, _)),) = drawn
    assert list(reward.lines[1].get_xdata()) == [2, 5]
    assert list(reward.lines[1].get_ydata()) == [0.2, 0.5]
    assert reward.get_legend().get_texts()[0].get_text() == "validation"
    assert len(kl.lines) == 1


def test_a_run_that_recorded_memory_gets_its_largest_workers_peak_rss_panel(tmp_path, drawn):
    with MetricsLogger(tmp_path / "run", backends=()) as logger:
        for iteration in range(4):
            memory = {"actor": {"host_peak_mib": 4000.0 + iteration}, "reward": {}}
            memory["reward"]["host_peak_mib"] = 500.0
            record = {"reward_mean": 0.5, "response_length_mean": 2.0, "memory": memory}
            logger.log(iteration, record)
    plot_metrics(tmp_path / "run" / "metrics.jsonl", tmp_path / "run.png")
    ((_, axes),) = drawn
    assert axes[-1].get_title() == "largest peak host RSS (MiB)"
    assert list(axes[-1].lines[0].get_ydata()) == [4000.0, 4001.0, 4002.0, 4003.0]


def test_each_domains_reward_is_drawn_over_the_mean_when_a_run_has_several(tmp_path, drawn):
    with MetricsLogger(tmp_path / "run", backends=()) as logger:
        for iteration in range(3):
            record = {"reward_mean": 0.5, "kl": 0.0, "response_length_mean": 2.0}
            record |= {"reward/math": 0.1 * iteration, "reward/code": 0.2, "reward/failed_share": 0}
            logger.log(iteration, record)
    plot_metrics(tmp_path / "run" / "metrics.jsonl", tmp_path / "curves.png")
    ((_, (reward, _, _)),) = drawn
    assert [t.get_text() for t in reward.get_legend().get_texts()] == ["code", "math"]
    assert list(reward.lines[2].get_ydata()) == [0.0, 0.1, 0.2]
