"""merge_over_world: every rank gets the union of the ranks' dicts, and each entry travels
once (replicas send nothing), so a checkpoint's full-state exchange does not multiply the
model in every rank's memory (backends/megatron/sharding.py)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from backends.megatron.sharding import merge_over_world
from tests.support.spawn import run_ranks


def count_object_bytes_sent(module) -> list[int]:
    """Wrap dist.all_gather_object to record the pickled size of what this rank sends."""
    import pickle

    sent: list[int] = []
    original = module.all_gather_object

    def recording(output, obj, group=None):
        sent.append(len(pickle.dumps(obj)))
        return original(output, obj, group=group)

    module.all_gather_object = recording
    return sent


def merge_case(rank: int, world: int, layout: str) -> dict:
    sent = count_object_bytes_sent(dist)
    weight = torch.full((256, 256), float(rank // 2))  # 256 KiB, the same on replicas
    if layout == "replicas":  # TP / DP replicas: the same full tensors everywhere
        local = {"a": torch.ones(256, 256), "b": torch.zeros(256, 256)}
    else:  # two pipeline stages, each held by two replicas (ranks 0, 1 and 2, 3)
        local = {f"stage{rank // 2}": weight}
    merged = merge_over_world(local)
    return {
        "names": sorted(merged),
        "same_objects": all(merged[k] is local.get(k) for k in merged),
        "values": {k: float(v.sum()) for k, v in merged.items()},
        "largest_send": max(sent),
    }


def test_replicas_keep_their_own_tensors_and_send_only_names():
    results = run_ranks(merge_case, 2, "replicas")
    for result in results:
        assert result["names"] == ["a", "b"] and result["same_objects"]
        assert result["largest_send"] < 1024  # the two names, not 512 KiB of tensors


def test_stages_are_merged_each_sent_once_by_its_lowest_rank():
    results = run_ranks(merge_case, 4, "stages")
    for rank, result in enumerate(results):
        assert result["names"] == ["stage0", "stage1"]
        assert result["values"] == {"stage0": 0.0, "stage1": 256.0 * 256}
        owner = rank in (0, 2)  # the lowest rank of each stage sends it; replicas do not
        assert (result["largest_send"] > 256 * 1024) == owner
