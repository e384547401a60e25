"""A worker the node's memory monitor killed ends the run with one line, not Ray's text."""

from __future__ import annotations

from mindrl.workers.group import WorkerDiedError, WorkerOutOfMemoryError, out_of_memory_line

RAY_TEXT = (
    "Task was killed due to the node running low on memory.\n"
    "Memory on the node (IP: 192.0.2.2, ID: c953324e) where the task (actor ID: 5a0c, "
    "name=ModelWorker.update) was running was 22.16GB used / 23.54GB limit (0.9414), "
    "which exceeds the memory usage threshold of 0.95.\n"
    "Ray killed this worker (ID: 8f2d) because it was the most recently scheduled task; ..."
)


def test_the_line_names_worker_stage_node_memory_and_the_knobs_of_the_role():
    line = out_of_memory_line("actor[1]", "update", RAY_TEXT)
    assert "\n" not in line
    assert line.startswith(
        "worker actor[1] was killed for memory during stage 'update' "
        "(node memory 22.16GB used / 23.54GB limit)"
    )
    assert "actor.micro_batch_size, rollout.kv_cache_mib" in line
    assert "metrics.jsonl under 'memory'" in line


def test_a_reward_worker_is_not_told_about_micro_batches():
    line = out_of_memory_line("reward[0]", "reward", "killed: out of memory")
    assert "micro_batch_size" not in line
    assert "(node memory" not in line


def test_with_its_roles_measured_peak_the_line_gives_it_instead_of_pointing_at_the_log():
    line = out_of_memory_line(
        "actor[0]", "rollout", RAY_TEXT, {"host_peak_mib": 5800.0, "device_peak_mib": 600.0}
    )
    assert "peak measured so far: actor 5.66G (device 0.59G);" in line
    assert "metrics.jsonl" not in line


def test_the_error_the_driver_catches_rebuilds_its_line_with_the_peak():
    error = WorkerOutOfMemoryError("critic[1]", "values", RAY_TEXT)
    assert isinstance(error, WorkerDiedError) and error.role == "critic"
    assert str(error) == out_of_memory_line("critic[1]", "values", RAY_TEXT)
    assert "critic 2.00G" in error.line({"host_peak_mib": 2048.0})
