"""Memory per role: workers' stage reports folded into one peak per role and key."""

from __future__ import annotations

from mindrl.metrics import format_progress_line
from mindrl.metrics.memory import book_peaks, format_memory, peaks_by_role


def test_a_stage_keeps_the_largest_peak_of_its_workers_and_ignores_other_keys():
    peaks: dict = {}
    book_peaks(peaks, "rollout", [{"host_peak_mib": 4000.0, "busy_s": 3.0}])
    book_peaks(peaks, "rollout", [{"host_peak_mib": 3500.0, "device_peak_mib": 600.0}])
    book_peaks(peaks, "advantage", [{"busy_s": 0.1}])
    assert peaks == {"rollout": {"host_peak_mib": 4000.0, "device_peak_mib": 600.0}}


def test_stages_fold_into_their_roles():
    stage_peaks = {
        "rollout": {"host_peak_mib": 4700.0, "device_peak_mib": 520.0},
        "update": {"host_peak_mib": 5100.0, "device_peak_mib": 510.0},
        "reward": {"host_peak_mib": 480.0},
        "advantage": {"host_peak_mib": 490.0},
    }
    roles = {"rollout": "actor", "update": "actor", "reward": "reward", "advantage": "reward"}
    assert peaks_by_role(stage_peaks, roles) == {
        "actor": {"host_peak_mib": 5100.0, "device_peak_mib": 520.0},
        "reward": {"host_peak_mib": 490.0},
    }


def test_the_progress_line_ends_with_each_roles_peak_in_gib():
    memory = {
        "actor": {"host_peak_mib": 4720.0, "device_peak_mib": 532.5},
        "reward": {"host_peak_mib": 491.5},
    }
    assert format_memory(memory) == "actor 4.61G (device 0.52G), reward 0.48G"
    line = format_progress_line(3, {"reward_mean": 0.5, "memory": memory})
    assert line.endswith("| peak actor 4.61G (device 0.52G), reward 0.48G")
