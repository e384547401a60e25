"""Controller and warehouse logic without Ray."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mindrl.dock.controller import ControllerState, balance_by_length, wait_and_claim
from mindrl.dock.schema import RL_FIELDS, RUN_FIELDS, DockError
from mindrl.dock.tensors import attention_mask, columns_from, to_tensordict
from mindrl.dock.warehouse import WarehouseStore
from mindrl.dock.wire import Columns, pad_columns
from mindrl.planner.sample_flow import central_volume_bytes, dispatch_seconds

FIELDS = ["prompt_ids", "response_ids", "reward"]


def ragged(lengths: list[int], seed: int = 0) -> Columns:
    rng = np.random.default_rng(seed)
    return Columns(rng.integers(0, 1000, sum(lengths)).astype(np.int64), np.array(lengths))


def test_a_claim_takes_only_ready_unconsumed_samples_once():
    state = ControllerState("reward", n_samples=8, group_size=2, fields=FIELDS)
    state.on_put(np.array([0, 1, 2, 5]), ["prompt_ids", "response_ids"], 0, np.array([3, 3, 3, 3]))
    assert state.claim(["response_ids"], 10, whole_groups=False).tolist() == [0, 1, 2, 5]
    assert state.claim(["response_ids"], 10, whole_groups=False).tolist() == []
    assert state.claim(["reward"], 10, whole_groups=False).tolist() == []


def test_a_put_s_weights_version_is_kept_per_sample_until_recycled_or_cleared():
    state = ControllerState("update", n_samples=6, group_size=2, fields=FIELDS)
    lengths = np.array([2, 2])
    state.on_put(np.array([0, 1]), ["response_ids"], 0, lengths, version=3)
    state.on_put(np.array([2, 3]), ["response_ids"], 0, lengths, version=4)
    state.on_put(np.array([0, 1]), ["reward"], 0, np.zeros(2, dtype=np.int64))  # says none
    assert state.version.tolist() == [3, 3, 4, 4, -1, -1]
    state.recycle(np.array([2, 3]))
    assert state.version.tolist() == [3, 3, -1, -1, -1, -1]
    state.clear()
    assert state.version.tolist() == [-1] * 6


def test_held_samples_are_skipped_by_claims_until_given_back_or_recycled():
    state = ControllerState("reward", n_samples=8, group_size=2, fields=FIELDS)
    state.on_put(np.arange(8), ["prompt_ids", "response_ids"], 0, np.full(8, 3))
    state.hold(np.array([0, 1, 4, 5]), True)  # two finished groups that wait for later
    # A claim of the batch's size takes exactly the groups not held, lowest index or not.
    assert state.claimable(["response_ids"], whole_groups=True) == 4
    assert state.claim(["response_ids"], 4, whole_groups=True).tolist() == [2, 3, 6, 7]
    state.hold(np.array([0, 1]), False)
    assert state.claim(["response_ids"], 8, whole_groups=True).tolist() == [0, 1]
    state.recycle(np.array([4, 5]))  # a recycled index is no longer held either
    state.on_put(np.array([4, 5]), ["prompt_ids", "response_ids"], 0, np.full(2, 3))
    assert state.claim(["response_ids"], 8, whole_groups=True).tolist() == [4, 5]


def test_whole_group_claims_never_split_a_group():
    state = ControllerState("advantage", n_samples=8, group_size=4, fields=FIELDS)
    state.on_put(np.array([0, 1, 2, 3, 4, 5]), ["reward"], 0, np.zeros(6, dtype=np.int64))
    assert state.claimable(["reward"], whole_groups=True) == 4
    assert state.claim(["reward"], 8, whole_groups=True).tolist() == [0, 1, 2, 3]
    with pytest.raises(DockError, match="use a multiple of 4"):
        state.claim(["reward"], 6, whole_groups=True)


def test_explicit_group_ids_keep_scattered_members_together():
    # Groups {0, 2, 5} and {1, 3, 4}: only the first is complete after the put.
    ids = np.array([7, 9, 7, 9, 9, 7])
    state = ControllerState("advantage", 6, 3, FIELDS, group_ids=ids)
    state.on_put(np.array([0, 2, 5, 1, 3]), ["reward"], 0, np.zeros(5, dtype=np.int64))
    assert state.claim(["reward"], 6, whole_groups=True).tolist() == [0, 2, 5]
    state.on_put(np.array([4]), ["reward"], 0, np.zeros(1, dtype=np.int64))
    assert state.claim(["reward"], 6, whole_groups=True).tolist() == [1, 3, 4]


def test_local_preference_never_splits_a_group_spread_over_warehouses():
    # Group 9 = {1, 3, 4} lives in warehouse 0; group 7 = {0, 2, 5} in warehouses 0 and 1.
    state = ControllerState("update", 6, 3, FIELDS, group_ids=np.array([7, 9, 7, 9, 9, 7]))
    state.on_put(np.array([0, 1, 2, 3, 4]), ["reward"], 0, np.zeros(5, dtype=np.int64))
    state.on_put(np.array([5]), ["reward"], 1, np.zeros(1, dtype=np.int64))
    first = state.claim(["reward"], 3, whole_groups=True, prefer_warehouse=0)
    assert first.tolist() == [1, 3, 4]  # the wholly local group, not 0, 2 + a stray
    assert sorted(first.tolist() + state.claim(["reward"], 3, True).tolist()) == list(range(6))


def test_claims_prefer_samples_in_the_local_warehouse():
    state = ControllerState("rollout", n_samples=8, group_size=2, fields=FIELDS)
    state.on_put(np.arange(4), ["prompt_ids"], 0, np.ones(4, dtype=np.int64))
    state.on_put(np.arange(4, 8), ["prompt_ids"], 1, np.ones(4, dtype=np.int64))
    assert state.claim(["prompt_ids"], 4, whole_groups=True, prefer_warehouse=1).tolist() == [
        4,
        5,
        6,
        7,
    ]


def test_unknown_fields_in_a_claim_are_named():
    state = ControllerState("update", 4, 1, FIELDS)
    with pytest.raises(DockError, match=r"unknown field\(s\) \['advantage'\]"):
        state.claim(["advantage"], 1, whole_groups=False)


def test_dp_split_is_even_in_count_and_balanced_in_length():
    indexes = np.arange(8)
    lengths = np.array([100, 1, 1, 1, 90, 2, 2, 3])
    parts = balance_by_length(indexes, lengths, 2)
    assert [len(p) for p in parts] == [4, 4]
    loads = sorted(int(lengths[p].sum()) for p in parts)
    assert loads[1] - loads[0] <= 12
    with pytest.raises(DockError, match="cannot split 8 samples evenly over 3"):
        balance_by_length(indexes, lengths, 3)


def test_a_claim_deals_data_parallel_ranks_balanced_prompt_plus_response_tokens():
    store = WarehouseStore(0, 0, 8, RUN_FIELDS)
    state = ControllerState("update", 8, 2, [*FIELDS, "text"])
    indexes = np.arange(8)
    # Long prompt texts, short prompts: the text is no token of the forward's.
    text = Columns(np.zeros(8 * 500, dtype=np.uint8), np.full(8, 500))
    prompts, responses = [30, 30, 2, 2, 2, 2, 2, 2], [1, 1, 40, 1, 1, 1, 1, 1]
    for columns in ({"prompt_ids": ragged(prompts), "text": text},
                    {"response_ids": ragged([9] * 8)},  # partial rollout: then finished
                    {"response_ids": ragged(responses)}):  # fmt: skip
        state.on_put(indexes, list(columns), 0, store.put(indexes, columns))
    request = (["response_ids"], 8, False, None)

    parts = asyncio.run(wait_and_claim(state, asyncio.Condition(), request, 1.0, 2))

    tokens = np.add(prompts, responses)
    assert state.load(indexes).tolist() == tokens.tolist()
    assert [len(p) for p in parts] == [4, 4]  # the same mini-batches on every rank
    # The best split of equal counts: 42 + 3 + 3 + 3 against 31 + 31 + 3 + 3.
    assert sorted(int(tokens[p].sum()) for p in parts) == [51, 68]


def test_dp_split_gives_each_part_what_its_warehouse_stores():
    indexes = np.arange(16)
    lengths = np.random.default_rng(0).integers(1, 50, 16)
    stored_in = indexes // 4  # warehouse w holds indexes 4w .. 4w + 3
    parts = balance_by_length(indexes, lengths, 4, stored_in, [2, 0, 3, 1])
    assert [p.tolist() for p in parts] == [[8, 9, 10, 11], [0, 1, 2, 3], [12, 13, 14, 15],
                                           [4, 5, 6, 7]]  # fmt: skip


def test_dp_split_crosses_only_what_a_node_cannot_hold():
    indexes = np.arange(12)
    lengths = np.array([9, 8, 7, 6, 5, 4, 9, 8, 7, 6, 5, 4])
    stored_in = np.array([0] * 6 + [1] * 6)
    # Two parts beside warehouse 0, one beside warehouse 1: room for 4 each.
    parts = balance_by_length(indexes, lengths, 3, stored_in, [0, 0, 1])
    assert [len(p) for p in parts] == [4, 4, 4]
    assert set(parts[2]) <= set(range(6, 12))  # the lone part reads only its own node
    remote = sum(int((stored_in[p] != w).sum()) for p, w in zip(parts, [0, 0, 1], strict=True))
    assert remote == 2  # warehouse 1's six samples fill its part; two must go elsewhere
    loads = sorted(int(lengths[p].sum()) for p in parts[:2])
    assert loads[1] - loads[0] <= 3  # the two parts on node 0 still balance by length


def test_dp_split_with_every_part_on_one_node_is_the_plain_split():
    indexes = np.arange(8)
    lengths = np.array([100, 1, 1, 1, 90, 2, 2, 3])
    plain = balance_by_length(indexes, lengths, 2)
    beside = balance_by_length(indexes, lengths, 2, indexes % 3, [1, 1])
    assert [p.tolist() for p in beside] == [p.tolist() for p in plain]


def test_metadata_is_a_few_scalars_per_sample_not_payload():
    state = ControllerState("update", 64, 8, FIELDS)
    state.on_put(np.arange(64), ["response_ids"], 0, np.full(64, 4096, dtype=np.int64))
    state.claim(["response_ids"], 64, whole_groups=True)
    # indexes + lengths on the put, indexes on the claim: 3 int64 per sample + headers.
    assert 3 * 8 * 64 <= state.metadata_bytes <= 3 * 8 * 64 + 64


def test_paper_table1_rows_follow_the_decoded_formula():
    # The paper prints 0.969 GB as 0.96 and 31.6K s as 31K (truncated), 3088 GB as 3.1K.
    small = central_volume_bytes(256, 8, 2048, 5, 8192)
    assert math.floor(small / 2**30 * 100) / 100 == 0.96
    assert dispatch_seconds(small) == pytest.approx(9.92, abs=0.005)
    large = central_volume_bytes(8192, 64, 4096, 8, 65536)
    assert round(large / 2**30 / 1000, 1) == 3.1 and large / 2**30 == pytest.approx(3088.0)
    assert math.floor(dispatch_seconds(large) / 1000) == 31


def test_a_bad_put_is_refused_whole_and_stores_nothing():
    store = WarehouseStore(0, 0, 4, RL_FIELDS)
    good = ragged([2, 3])
    bad_dtype = Columns(np.zeros(5, dtype=np.float32), np.array([2, 3]))
    with pytest.raises(DockError, match="field 'response_ids' must be int64, got float32"):
        store.put(np.array([0, 1]), {"prompt_ids": good, "response_ids": bad_dtype})
    with pytest.raises(DockError, match="unknown field 'logits'"):
        store.put(np.array([0, 1]), {"prompt_ids": good, "logits": good})
    bad_shape = Columns(np.zeros((2, 3), dtype=np.float32), np.array([1, 1]))
    with pytest.raises(DockError, match=r"field 'reward' needs per-sample shape \(\)"):
        store.put(np.array([0, 1]), {"reward": bad_shape})
    with pytest.raises(DockError, match=r"owns indexes \[0, 4\)"):
        store.put(np.array([3, 4]), {"prompt_ids": good})
    assert all(not samples for samples in store.data.values())


def test_variable_fields_are_stored_unpadded_and_padded_on_the_way_out():
    store = WarehouseStore(0, 0, 4, RL_FIELDS)
    store.put(
        np.array([2, 0]),
        {"prompt_ids": Columns(np.array([7, 8, 9], dtype=np.int64), np.array([1, 2]))},
    )
    assert store.data["prompt_ids"][0].tolist() == [8, 9]
    values, lengths = store.get(np.array([0, 2]), ["prompt_ids"])["prompt_ids"]
    assert values.tolist() == [[8, 9], [7, 0]] and lengths.tolist() == [2, 1]


def test_padded_tensors_with_lengths_round_trip_through_columns():
    padded = torch.tensor([[1, 2, 0], [3, 0, 0]])
    column = columns_from(padded, torch.tensor([2, 1]), RL_FIELDS["response_ids"])
    assert column.values.tolist() == [1, 2, 3]
    values, lengths = pad_columns([column.values[:2], column.values[2:]], RL_FIELDS["response_ids"])
    assert values.tolist() == [[1, 2], [3, 0]] and lengths.tolist() == [2, 1]
    mask = attention_mask(torch.from_numpy(lengths), 2)
    assert mask.tolist() == [[True, True], [True, False]]


def test_a_get_of_one_equal_length_put_is_a_view_of_the_stored_buffer():
    store = WarehouseStore(0, 0, 4, RL_FIELDS)
    buffer = np.arange(12, dtype=np.int64)
    store.put(np.arange(4), {"response_ids": Columns(buffer, np.full(4, 3))})
    values, lengths = store.get(np.arange(4), ["response_ids"])["response_ids"]
    assert np.shares_memory(values, buffer) and values.tolist() == buffer.reshape(4, 3).tolist()
    reordered, _ = store.get(np.array([1, 0]), ["response_ids"])["response_ids"]
    assert not np.shares_memory(reordered, buffer) and reordered.tolist() == [[3, 4, 5], [0, 1, 2]]
    batch = to_tensordict({"response_ids": (values, lengths)}, RL_FIELDS)
    assert batch["response_ids"].data_ptr() == values.__array_interface__["data"][0]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.large_base_example])
@given(data=st.data(), group_size=st.sampled_from([1, 2, 4]), consumers=st.integers(1, 4))
def test_any_interleaving_consumes_every_index_once_with_identical_payloads(
    data, group_size, consumers
):
    n = 4 * group_size
    state = ControllerState("reward", n, group_size, FIELDS)
    store = WarehouseStore(0, 0, n, RL_FIELDS)
    lengths = data.draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
    payload = {i: np.arange(i, i + lengths[i], dtype=np.int64) for i in range(n)}
    pending = list(data.draw(st.permutations(range(n))))
    seen: list[int] = []
    while pending or state.claimable(["response_ids"], group_size > 1):
        nothing_ready = not state.claimable(["response_ids"], group_size > 1)
        if pending and (nothing_ready or data.draw(st.booleans())):
            chunk = [pending.pop() for _ in range(min(len(pending), data.draw(st.integers(1, 3))))]
            column = Columns(
                np.concatenate([payload[i] for i in chunk]), np.array([lengths[i] for i in chunk])
            )
            lens = store.put(np.array(chunk), {"response_ids": column})
            state.on_put(np.array(chunk), ["response_ids"], 0, lens)
        else:
            want = data.draw(st.integers(1, 3)) * group_size
            for _ in range(consumers):
                got = state.claim(["response_ids"], want, whole_groups=group_size > 1)
                if len(got):
                    values, lens = store.get(got, ["response_ids"])["response_ids"]
                    for row, index in enumerate(got.tolist()):
                        assert values[row, : lens[row]].tolist() == payload[index].tolist()
                seen += got.tolist()
    assert sorted(seen) == list(range(n))
    state.clear()
    store.clear()
    assert state.claimable(["response_ids"], False) == 0 and not store.data["response_ids"]


def test_the_dock_actors_modules_do_not_import_torch():
    # Each actor is its own Ray worker process: without torch it starts light and fast.
    code = (
        "import sys, mindrl.dock.builder, mindrl.dock\n"
        "mindrl.dock.DockError\n"
        "print(sorted(m for m in ('torch', 'tensordict') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


async def _stream_through(n: int, pieces: list[int], step: int, dp_parts: int) -> list[list]:
    """Put ``n`` samples in ``pieces`` while a streaming stage claims chunks of them."""
    state = ControllerState("reward", n, 4, FIELDS)
    changed = asyncio.Condition()

    async def produce() -> None:
        first = 0
        for size in pieces:
            await asyncio.sleep(0.001)
            indexes = np.arange(first, first + size)
            state.on_put(indexes, ["response_ids"], 0, (indexes % 5 + 1).astype(np.int64))
            async with changed:
                changed.notify_all()
            first += size

    async def consume() -> list[list]:
        chunks, claimed = [], 0
        while claimed < n:
            request = (["response_ids"], n - claimed, False, None)
            parts = await wait_and_claim(state, changed, request, 5.0, dp_parts, step)
            chunks.append([p.tolist() for p in parts])
            claimed += sum(len(p) for p in parts)
        return chunks

    _, chunks = await asyncio.gather(produce(), consume())
    return chunks


@pytest.mark.parametrize("seed", range(4))
def test_chunked_claims_hand_every_sample_exactly_once_as_it_becomes_ready(seed):
    rng = np.random.default_rng(seed)
    n, step = 48, 2
    pieces = []
    while sum(pieces) < n:  # uneven puts, as generation ranks finish their chunks
        pieces.append(int(min(rng.integers(1, 9), n - sum(pieces))))
    chunks = asyncio.run(_stream_through(n, pieces, step, dp_parts=2))
    taken = [i for chunk in chunks for part in chunk for i in part]
    assert sorted(taken) == list(range(n))  # all of them, none twice
    assert len(chunks) > 1  # claims were answered before the last put
    for left, right in chunks:  # every chunk splits evenly over the two DP ranks
        assert len(left) == len(right) > 0


def test_a_chunked_claim_waits_for_a_full_step_and_names_the_stage_when_starved():
    state = ControllerState("reward", 8, 4, FIELDS)
    state.on_put(np.array([0]), ["response_ids"], 0, np.array([3]))
    request = (["response_ids"], 8, False, None)
    with pytest.raises(DockError, match=r"stage 'reward' waited 0\.05 s for 2 samples"):
        asyncio.run(wait_and_claim(state, asyncio.Condition(), request, 0.05, 2, step=2))
    assert state.claimable(["response_ids"], False) == 1  # nothing was taken
    with pytest.raises(DockError, match="multiple of the 2 data-parallel parts"):
        asyncio.run(wait_and_claim(state, asyncio.Condition(), request, 0.05, 2, step=3))
