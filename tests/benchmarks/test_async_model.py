"""The simulated cluster of benchmarks/async.py: its cost model behaves as stated.

No training runs here; the measured half of the benchmark needs Ray and minutes.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

# ``async`` is a keyword, so the script is loaded from its path.
_spec = importlib.util.spec_from_file_location(
    "async_benchmark", Path(__file__).resolve().parents[2] / "benchmarks" / "async.py"
)
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench  # dataclasses look their module up while it loads
_spec.loader.exec_module(bench)

#: The paper's setup, shortened so the test is fast: fewer, shorter responses.
SMALL = bench.ClusterModel(prompts=32, response_mean=256.0, response_max=1024)


def test_streaming_hides_reward_behind_generation_and_changes_nothing_else():
    sim = bench.simulate(SMALL)["rows"]
    sync, stream = sim["sync"], sim["stream"]
    assert stream["iteration_s"] < sync["iteration_s"]
    hidden = sync["iteration_s"] - stream["iteration_s"]
    # What streaming saves is the reward time after generation, nothing more.
    assert hidden == pytest.approx(sync["reward_tail_s"] - stream["reward_tail_s"])
    assert sync["reward_tail_s"] == pytest.approx(sync["reward_busy_s"])
    for key in ("generation_s", "ref_logp_busy_s", "update_s", "dock_dispatch_s"):
        assert stream[key] == sync[key]


def test_without_reward_work_streaming_gains_nothing():
    sim = bench.simulate(dataclasses.replace(SMALL, reward_ms=0.0))["rows"]
    assert sim["stream"]["iteration_s"] == pytest.approx(sim["sync"]["iteration_s"])


def test_long_responses_finish_last_and_a_replica_decodes_until_its_longest():
    lengths = bench.response_lengths(SMALL)
    assert lengths.max() <= SMALL.response_max and lengths.min() >= 1
    ready = bench.generation_ready_times(SMALL, lengths, SMALL.devices)
    for replica in range(SMALL.devices):
        mine = np.arange(replica, len(lengths), SMALL.devices)
        order = np.argsort(lengths[mine], kind="stable")
        assert np.all(np.diff(ready[mine][order]) >= 0)


def test_the_partial_rollout_summary_gives_iteration_time_percentiles_and_trained_throughput():
    # Ten iterations of 1..10 s, two rounds each; the last trains nothing (at its cap).
    records = [
        {
            "iteration_time_s": float(t),
            "tps": 2.0,
            "reward_mean": 0.5,
            "trained_groups": 4,
            "generation_rounds": 2,
            "staleness_max": t % 2,
            "time": {"rollout": t / 2, "update": 0.25},
        }
        for t in range(1, 11)
    ]
    records[-1] |= {"tps": 0.0, "trained_groups": 0}
    summary = bench.summarize_partial(records, groups=4)
    assert (summary["p50_s"], summary["p90_s"], summary["max_s"]) == (5.5, 9.1, 10.0)
    assert summary["trained_tokens_per_s"] == pytest.approx(2.0 * 45 / 55)
    assert summary["trained_groups_per_s"] == pytest.approx(36 / 55)
    assert summary["groups_per_iteration"] == pytest.approx(3.6)
    assert summary["rounds_per_iteration"] == 2
    assert summary["staleness_mean"] == 0.5
    assert summary["stage_s"] == {"rollout": pytest.approx(2.75), "update": 0.25}
    # A whole-rollout record has no trained_groups: it trains every group in one round.
    keep = ("iteration_time_s", "tps", "reward_mean")
    whole = bench.summarize_partial([{k: records[0][k] for k in keep}], 4)
    assert (whole["groups_per_iteration"], whole["rounds_per_iteration"]) == (4, 1)
    assert whole["staleness_mean"] == 0
    assert whole["trained_groups_per_s"] == 4.0 and whole["stage_s"] == {}


#: A case small enough to work out by hand: 4 devices, 2 prompts x 2 responses of one
#: token after a 99-token prompt (every length clipped to 1), 1e9 params, round constants;
#: 0.5e12 FLOP/s for training and prefill, and decode steps bound by their reads (as real
#: ones are at these batch sizes: the compute floor is tested on its own).
HAND = bench.ClusterModel(
    devices=4,
    rollout_devices=2,
    params=1e9,
    layers=1,
    kv_heads=1,
    head_dim=250,  # K and V in bf16: 1000 B per token
    prompts=2,
    responses_per_prompt=2,
    prompt_len=99,
    response_mean=1.0,
    response_max=1,
    peak_flops=1e14,
    mfu=0.005,
    prefill_mfu=0.005,
    decode_mfu=0.5,
    hbm_bytes_per_s=1e12,
    hbm_efficiency=1.0,
    reward_ms=100.0,
    reward_workers=2,
    host_bytes_per_s=8e9,
    transfer_mb_per_s=1000.0,
)


def test_an_async_iteration_is_its_serial_stages_plus_the_longer_of_generation_and_update():
    # On-policy: generation waits for the update; one batch ahead it runs beside it.
    assert bench.disaggregated_iteration(3.0, 1.0, 5.0, max_staleness=0) == (9.0, 0.0)
    assert bench.disaggregated_iteration(3.0, 1.0, 5.0, max_staleness=1) == (6.0, 3.0)
    assert bench.disaggregated_iteration(7.0, 1.0, 5.0, max_staleness=1) == (8.0, 5.0)


def test_the_simulated_modes_on_a_hand_checked_case():
    sim = bench.simulate(HAND)
    rows = sim["rows"]
    dock = rows["sync"]["dock_dispatch_s"]
    # Per response: a forward 2e9 x 100 tokens / 0.5e12 = 0.4 s, an update 3x that; the
    # reward 100 ms over 2 workers; the bf16 weights, 2e9 B at 1000 MB/s (MB = 2^20 B).
    transfer = 2e9 / 2**20 / 1000
    assert bench.weight_transfer_seconds(HAND) == transfer
    # Collocated on 4 replicas of 1 response: prefill 2e9 x 99 / 0.5e12 = 0.396 s, one
    # decode step reading 2e9 B of weights + 100 tokens x 1000 B at 1e12 B/s; swap
    # 2 x 16 B x 1e9 / 4 devices at 8e9 B/s = 1 s; reference 1.6 / 4, update 4.8 / 4.
    generation = 0.396 + 2.0001e-3
    sync = rows["sync"]
    assert sync["generation_s"] == pytest.approx(generation, rel=1e-12)
    assert sync["iteration_s"] - dock == pytest.approx(1 + generation + 0.2 + 0.4 + 1.2, rel=1e-12)
    assert sync["tps"] == pytest.approx(4 * 100 / (4 * sync["iteration_s"]), rel=1e-12)
    # Disaggregated 2 + 2: 2 replicas of 2 responses (prefill 0.792 s, a step 2e9 + 200 x
    # 1000 B), reference 1.6 / 2 and update 4.8 / 2 on the other 2, no swap, one transfer.
    generation = 0.792 + 2.0002e-3
    on_policy, ahead = rows["disagg-sync"], rows["async"]
    for row in (on_policy, ahead):
        assert row["generation_s"] == pytest.approx(generation, rel=1e-12)
        assert (row["ref_logp_busy_s"], row["update_s"]) == (0.8, 2.4)
        assert (row["reshard_swap_s"], row["weight_transfer_s"]) == (0.0, transfer)
    serial = 0.2 + transfer + 0.8
    assert on_policy["iteration_s"] - dock == pytest.approx(serial + generation + 2.4, rel=1e-12)
    assert on_policy["generation_hidden_s"] == 0.0
    # One batch ahead the whole generation hides behind the 2.4 s update.
    assert ahead["iteration_s"] - dock == pytest.approx(serial + 2.4, rel=1e-12)
    assert ahead["generation_hidden_s"] == pytest.approx(generation, rel=1e-12)
    assert ahead["speedup"] == pytest.approx(sync["iteration_s"] / ahead["iteration_s"])
    # Best split: 1 device generating 4 responses (1.584 + 2.0004e-3 s) beside an update of
    # 4.8 / 3 = 1.6 s and a reference pass of 1.6 / 3 (2 generating: 3.4 s + transfer; 3: 6.6).
    best = rows["async, best split"]
    assert (best["rollout_devices"], best["devices"]) == (1, "1 gen+3 train")
    assert best["iteration_s"] - dock == pytest.approx(0.2 + transfer + 1.6 / 3 + 1.6, rel=1e-12)
    assert best["generation_hidden_s"] == pytest.approx(1.584 + 2.0004e-3, rel=1e-12)


def test_the_decode_steps_cost_what_the_live_sequences_hold():
    # Lengths 1, 3, 3 on one replica, 1-token prompts, 1000 B of K and V per token, weights
    # 2e9 B at 1e12 B/s: step 1 holds 3 x (1 + 1) tokens, step 2 2 x (1 + 2) (the ended
    # sequence's cache is freed), step 3 2 x (1 + 3); the 3 prefills cost 3 x 2e9 x 1 / 0.5e12.
    m = dataclasses.replace(HAND, prompt_len=1)
    ready = bench.generation_ready_times(m, np.array([3, 1, 3]), devices=1)
    steps = [(2e9 + 1000 * tokens) / 1e12 for tokens in (6, 6, 8)]
    prefill = 3 * 2e9 / 0.5e12
    expected = [prefill + sum(steps), prefill + steps[0], prefill + sum(steps)]
    np.testing.assert_allclose(ready, expected, rtol=1e-12)


def test_a_decode_step_costs_its_flops_where_they_take_longer_than_its_reads():
    # One sequence of 1 token after a 1-token prompt at 1e6 FLOP/s: the prefill and the
    # step's 2e9 FLOPs (plus attention, 4 x 1 x 1 x 250 per context token, 2 tokens) are
    # far slower than reading 2e9 B at 1e12 B/s.
    m = dataclasses.replace(HAND, prompt_len=1, q_heads=1, peak_flops=2e6, prefill_mfu=0.5)
    ready = bench.decode_replica(m, np.array([1]), slots=1)
    flops = 2e6 * 0.5
    np.testing.assert_allclose(ready, [2e9 / flops + (2e9 + 1000 * 2) / flops], rtol=1e-12)


def test_no_placement_beats_the_overlap_ceiling_and_each_device_is_simulated():
    sim = bench.simulate(SMALL)
    rows = sim["rows"]
    for prefix, lengths in (("", "paper"), ("long-cot: ", "long-cot")):
        best = rows[prefix + "continuous async, best split"]["throughput_vs_sync"]
        assert best <= sim["ceiling_vs_sync"][lengths] + 1e-9
        # The sync batch's drain: its generation is slower than the full-slot rate's.
        assert sim["sync_generation_vs_full_slots"][lengths] > 1.0
    assert list(sim["by_device"]) == list(bench.DEVICES)
    for name, device in sim["by_device"].items():
        figures, source = bench.DEVICES[name]
        assert {k: device[k] for k in figures} == figures and device["source"] == source
        assert device["best_split_vs_sync"] <= device["ceiling_vs_sync"] + 1e-9


def test_the_same_batch_on_more_devices_drains_longer_and_no_scale_beats_its_floor():
    scales = bench.simulate(SMALL)["by_scale"]
    assert list(scales) == list(bench.SCALES)
    drains = [scale["sync_generation_vs_full_slots"] for scale in scales.values()]
    # Fewer sequences per device: sync's batch waits for its longest response longer.
    assert drains == sorted(drains) and len(set(drains)) == len(drains)
    for devices, scale in scales.items():
        assert scale["sequences_per_device"] == -(-SMALL.samples // devices)
        assert scale["best_split_vs_sync"] <= scale["ceiling_vs_sync"] + 1e-9
        assert scale["work_floor_s"] * scale["ceiling_vs_sync"] == pytest.approx(
            scale["sync_iteration_s"]
        )
        assert scale["twice_sync_s"] == pytest.approx(scale["sync_iteration_s"] / 2)


def test_a_replica_with_fewer_slots_than_sequences_admits_one_as_another_ends():
    # Two slots for lengths 1, 3, 2: the third starts (its prefill) when the first ends.
    m = dataclasses.replace(HAND, prompt_len=1)
    ready = bench.decode_replica(m, np.array([1, 3, 2]), slots=2)
    prefill, step = 2e9 / 0.5e12, lambda tokens: (2e9 + 1000 * tokens) / 1e12
    first = 2 * prefill + step(4)  # both live hold prompt + 1 token
    third = first + prefill + step(3 + 2) + step(4 + 3)  # second at 2, 3; third at 1, 2
    np.testing.assert_allclose(ready, [first, third, third], rtol=1e-12)


def test_the_kv_cache_caps_the_live_sequences_of_a_replica():
    m = bench.ClusterModel()
    lengths = bench.response_lengths(m)
    slots = bench.kv_slots(m, lengths)
    live_context = m.prompt_len + (lengths**2).mean() / lengths.mean() / 2
    budget = 64e9 * 0.9 - 2 * 7.6e9
    assert slots == int(budget // (live_context * 2 * 28 * 4 * 128 * 2))
    assert 0 < slots < m.samples // m.devices  # a batch's share does not fit at once


def test_continuous_generation_never_waits_for_a_batchs_longest_response():
    # One replica, one slot too few for the batch: the batch mode waits for its tail,
    # the continuous rate does not; with equal lengths the two agree.
    m = dataclasses.replace(HAND, prompt_len=8)
    lengths = np.array([1, 1, 1, 1, 1, 1, 40, 1])
    batch = bench.decode_replica(m, lengths, slots=4).max()
    rate = bench.continuous_replica_rate(m, lengths, slots=4)
    assert len(lengths) / rate < batch
    same = np.full(8, 5)
    whole = bench.decode_replica(m, same, slots=4).max()
    continuous = bench.continuous_replica_rate(m, same, slots=4)
    # Steady state: 4 sequences per 5 steps and one prefill each; the batch pays its
    # first prefills and two waves.
    assert 8 / continuous == pytest.approx(whole, rel=0.05)


def test_continuous_async_is_the_slower_of_generation_training_and_reward():
    sim = bench.simulate(SMALL)["rows"]
    row = sim["continuous async"]
    training = row["update_s"] + max(row["weight_transfer_s"], row["ref_logp_busy_s"])
    slowest = max(training, row["generation_s"], row["reward_busy_s"])
    assert row["iteration_s"] == pytest.approx(slowest + row["dock_dispatch_s"])
    best = sim["continuous async, best split"]
    assert best["iteration_s"] <= row["iteration_s"]
    assert all(f"long-cot: {name}" in sim for name in ("sync", "continuous async"))
    assert row["throughput_vs_sync"] == pytest.approx(
        sim["sync"]["iteration_s"] / row["iteration_s"]
    )


def measured_record(seconds: float, tps: float, **extra) -> dict:
    """A metrics record as the trainer writes it, with the fields the summary reads."""
    return {
        "iteration_time_s": seconds,
        "tps": tps,
        "reward_mean": 0.5,
        "time": {"rollout": 0.5, "update": 1.0},
        "busy": {"rollout": 0.4, "update": 0.9},
        "overlap": {"total": 0.0},
        "overhead": {"dock_s": 0.1, "reshard_s": 0.2, "scheduling_s": 0.05, "share": 0.2},
        "response_length_mean": 4.0,
        "prompt_length_mean": 6.0,
        **extra,
    }


def test_the_measured_summary_weights_lengths_by_trained_groups_and_sums_refusals():
    # A continuous run: 2 and 6 groups trained, responses of 2 and 10 tokens on average.
    records = [
        measured_record(1.0, 1.0, trained_groups=2, response_length_mean=2.0,
                        drawn_groups=3, dropped_stale_groups=1),
        measured_record(1.0, 1.0, trained_groups=6, response_length_mean=10.0,
                        drawn_groups=6, dropped_stale_groups=0),
    ]  # fmt: skip
    s = bench.summarize(records, samples_per_iteration=8, groups=2)
    assert s["response_length_mean"] == pytest.approx((2 * 2 + 6 * 10) / 8)
    assert s["prompt_length_mean"] == pytest.approx(6.0)
    assert (s["drawn_groups"], s["dropped_stale_groups"]) == (9, 1)
    assert "dropped_stale_groups" not in bench.summarize([measured_record(1.0, 1.0)], 8, 2)


def test_the_measured_summary_and_its_ratios_against_sync():
    sync = [measured_record(2.0, 100.0), measured_record(3.0, 80.0), measured_record(2.0, 100.0)]
    disagg = [measured_record(1.25, 160.0, staleness_max=0, staleness_mean=0.0)] * 3
    # The async run's rollout waited 0 s: its 0.6 s of generation ran during the update.
    stale = {"staleness_max": 1, "time": {"rollout": 0.0, "update": 1.0, "weight_transfer": 0.1},
             "busy": {"rollout": 0.6, "update": 0.9, "weight_transfer": 0.1},
             "overlap": {"rollout": 0.6, "total": 0.6}}  # fmt: skip
    async_ = [
        measured_record(1.0, 200.0, **stale, staleness_mean=1.0),
        measured_record(1.5, 150.0, **stale, staleness_mean=0.5),
        measured_record(1.0, 200.0, **stale, staleness_mean=1.0),
    ]
    summaries = {
        "sync": bench.summarize(sync, samples_per_iteration=8, groups=2),
        "disagg-sync": bench.summarize(disagg, samples_per_iteration=8, groups=2),
        "async": bench.summarize(async_, samples_per_iteration=8, groups=2),
    }
    s = summaries["sync"]
    assert (s["iteration_s"], s["tps"], s["samples_per_s"]) == (2.0, 100.0, 4.0)
    assert s["groups_per_s"] == pytest.approx(3 * 2 / 7.0)  # trained groups / wall seconds
    assert s["stage_s"] == {"rollout": 0.5, "update": 1.0}
    assert s["overhead_s"]["reshard_s"] == pytest.approx(0.2)
    assert "staleness_max" not in s  # a collocated run's records carry none
    a = summaries["async"]
    assert (a["iteration_s"], a["tps"], a["samples_per_s"]) == (1.0, 200.0, 8.0)
    assert (a["staleness_max"], a["staleness_mean"]) == (1, pytest.approx(2.5 / 3))
    assert a["overlap_s"] == {"rollout": pytest.approx(0.6), "total": pytest.approx(0.6)}
    assert a["stage_s"]["rollout"] == 0.0 and a["busy_s"]["weight_transfer"] == pytest.approx(0.1)
    # Each mode's repeats, run next to each other: repeat i of a mode over repeat i of its
    # baseline, and the median of those.
    for mode, repeats in {"sync": [2.0, 1.0, 1.5], "disagg-sync": [1.0, 1.0, 1.0],
                          "async": [3.0, 3.0, 1.8]}.items():  # fmt: skip
        summaries[mode]["groups_per_s_per_repeat"] = repeats
    ratios = bench.ratios(summaries)
    assert list(ratios) == ["disagg-sync / sync", "async / sync", "async / disagg-sync"]
    assert ratios["async / sync"] == {
        "iteration_time": 0.5,
        "throughput": 2.0,
        "samples_per_s": 2.0,
        "groups_per_s": pytest.approx(7.0 / 3.5),
        "groups_per_s_per_repeat": pytest.approx([1.5, 3.0, 1.2]),
        "groups_per_s_median_repeat": pytest.approx(1.5),
    }
    assert ratios["async / disagg-sync"]["iteration_time"] == pytest.approx(0.8)
    assert ratios["async / disagg-sync"]["throughput"] == pytest.approx(1.25)


def test_every_mode_runs_on_the_same_devices_and_the_config_accepts_it():
    from mindrl.config import load_config
    from trainers.registry import get_algorithm

    args = bench.build_parser().parse_args([])
    rollout_devices, kinds = bench.mode_overrides(args, world=2)
    assert rollout_devices == 1
    assert list(kinds) == ["sync", "stream", "disagg-sync", "async", "continuous"]
    for mode, overrides in kinds.items():
        config = load_config(args.config, overrides, algorithm=get_algorithm("grpo"))
        assert config.world_size == 2 and config.actor.parallel.tp == 1
        disaggregated = config.rollout.placement == "disaggregated"
        assert disaggregated == (mode in ("disagg-sync", "async", "continuous"))
        assert config.rollout.devices == (1 if disaggregated else 0)
        assert config.rollout.max_staleness == (mode in ("async", "continuous"))
        assert config.rollout.continuous == (mode == "continuous")
    assert load_config(args.config, kinds["stream"]).dock.pipeline == "stream"
    # --continuous-slots reaches the continuous mode alone (the others refuse the option).
    args = bench.build_parser().parse_args(["--continuous-slots", "256"])
    _, kinds = bench.mode_overrides(args, world=2)
    assert [m for m, o in kinds.items() if "rollout.continuous_slots=256" in o] == ["continuous"]
    config = load_config(args.config, kinds["continuous"], algorithm=get_algorithm("grpo"))
    assert config.rollout.continuous_slots == 256
