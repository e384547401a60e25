"""TPS by the paper's Eq. 5 (docs/architecture.md §7) and the one-line progress report."""

from __future__ import annotations

import io

import pytest

from mindrl.metrics import format_progress_line, generation_progress, mean_tps, tokens_per_second


def test_tps_follows_eq5_on_known_numbers():
    # G=16 prompts, N=8 samples, L_p=6, L_r=2 -> 1024 tokens; 2 devices, 4 s -> 128 tok/s/dev.
    assert tokens_per_second(16, 8, 6.0, 2.0, num_devices=2, iteration_time_s=4.0) == 128.0
    # Paper-scale: G=256, N=8, L_p=2048, L_r=8192 on 384 devices in 100 s.
    expected = 256 * 8 * (2048 + 8192) / (384 * 100)
    assert tokens_per_second(256, 8, 2048, 8192, 384, 100.0) == pytest.approx(expected)


def test_tps_refuses_zero_devices_or_time():
    with pytest.raises(ValueError, match="num_devices > 0"):
        tokens_per_second(1, 1, 1, 1, num_devices=0, iteration_time_s=1.0)
    with pytest.raises(ValueError, match="iteration_time_s > 0"):
        tokens_per_second(1, 1, 1, 1, num_devices=1, iteration_time_s=0.0)


def test_mean_tps_averages_five_iterations_after_warmup():
    records = [{"tps": value} for value in (1000, 10, 20, 30, 40, 50, 9999)]
    assert mean_tps(records, warmup=1, window=5) == 30.0
    with pytest.raises(ValueError, match="warm-up"):
        mean_tps(records[:1])


def test_progress_line_shows_every_field_and_stage_time():
    metrics = {
        "reward_mean": 0.7349,
        "response_length_mean": 2.06,
        "kl": 0.00123,
        "entropy": 1.5,
        "clip_fraction": 0.031,
        "tps": 1234.4,
        "iteration_time_s": 4.214,
        "time": {"rollout": 2.1, "reward": 0.05, "update": 1.9},
    }
    line = format_progress_line(12, metrics)
    assert line == (
        "iter   12 | reward 0.735 | resp_len 2.1 | kl 0.0012 | entropy 1.500 | clip 0.031 | "
        "tps 1234 | time 4.21s (rollout 2.10 reward 0.05 update 1.90)"
    )
    assert "\n" not in line


def test_progress_line_marks_unreported_metrics():
    line = format_progress_line(1, {"reward_mean": 0.25})
    assert line.startswith("iter    1 | reward 0.250 | resp_len - | kl - |")


def test_progress_line_shows_validation_after_the_iterations_it_ran():
    metrics = {"reward_mean": 0.5, "val/reward_mean": 0.8125, "val/pass@4": 0.9, "val/time_s": 3}
    line = format_progress_line(9, metrics)
    assert "| tps - | val/reward_mean 0.812 | val/pass@4 0.900 | time -s" in line
    assert "val/time_s" not in line


def test_a_preference_run_shows_its_loss_accuracy_rewards_and_margin_instead_of_reward():
    metrics = {
        "loss": 0.25331,
        "preference_accuracy": 0.96875,
        "chosen_reward": 0.548,
        "rejected_reward": -0.808,
        "reward_margin": 1.356,
        "entropy": 1.901,
        "iteration_time_s": 0.26,
        "time": {"ref_logp": 0.07, "update": 0.18},
    }
    assert format_progress_line(38, metrics) == (
        "iter   38 | loss 0.2533 | pref_acc 0.969 | chosen 0.548 | rejected -0.808 | "
        "margin 1.356 | entropy 1.901 | time 0.26s (ref_logp 0.07 update 0.18)"
    )


class Terminal(io.StringIO):
    """A stream that says it is a terminal, as an interactive stderr does."""

    def isatty(self) -> bool:
        return True


def test_an_embodied_run_shows_its_success_rate_return_and_episode_length():
    metrics = {
        "success_rate": 0.34375,
        "reward_mean": 0.6121,
        "episode_length_mean": 10.94,
        "entropy": 5.4981,
        "clip_fraction": 0.0123,
        "grad_norm": 0.8712,
        "env_frames_per_s": 1190.4,
        "iteration_time_s": 3.02,
        "time": {"rollout": 0.61, "update": 2.41},
    }
    assert format_progress_line(12, metrics) == (
        "iter   12 | success 0.344 | return 0.612 | ep_len 10.9 | entropy 5.498 | clip 0.012 "
        "| grad_norm 0.871 | frames/s 1190 | time 3.02s (rollout 0.61 update 2.41)"
    )


def test_generation_progress_bar_counts_updates_on_a_terminal():
    screen = Terminal()
    with generation_progress(total=10, enabled=True, file=screen) as bar:
        bar.update(4)
        bar.update(6)
        assert bar.n == 10
    assert screen.getvalue().startswith("\rgenerate:   0%")  # later frames: every 0.1 s
    with generation_progress(total=10, enabled=False, file=Terminal()) as bar:
        assert bar.disable


def test_a_redirected_log_gets_no_progress_bar_frames():
    log = io.StringIO()  # a file or a pipe: isatty() is False
    with generation_progress(total=10, enabled=True, file=log) as bar:
        bar.update(10)
        assert bar.disable
    assert log.getvalue() == ""
