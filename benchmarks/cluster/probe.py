"""Move a known payload between two warehouses of a 2-node shaped cluster and time it
against the link rate: the check that the cluster's links are what they claim.

    .venv/bin/python -m benchmarks.cluster.probe --link-mb-per-s 16 --mib 8

Builds the cluster (benchmarks/cluster/netns.py), then inside node 0 (``--inside``) a
driver with a two-warehouse dock stores the payload in node 0's warehouse, copies it into
node 1's (one crossing of node 0's uplink and node 1's downlink) and reads the copy back
(the other direction), checking every byte. Prints one JSON object: seconds and bytes on
each link per move, and what the link rate predicts.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from benchmarks.cluster.netns import (
    PYTHON,
    REPORT_MARKER,
    ShapedCluster,
    dock_endpoints,
    refused_in_one_line,
    report_line,
)

FIELD = "response_ids"  # int64, per-sample variable length


def moves(mib: float, token: str) -> dict:
    """Inside node 0: the two timed moves and the bytes each put on the links."""
    import numpy as np
    import ray

    from mindrl.dock import RL_FIELDS, DockClient, create_dock, shutdown_dock

    ray.init(logging_level="ERROR", log_to_driver=False)
    links = ShapedCluster(2, token=token)
    handle = create_dock(RL_FIELDS, {"copy": [FIELD]}, 4, warehouses=2)
    client = DockClient(handle)
    if client.local_warehouse != 0 or handle.warehouses[1].node_id == handle.warehouses[0].node_id:
        raise SystemExit("error: the two warehouses are not on node 0 and node 1")
    rows = int(mib * 2**20) // 8 // 2  # two samples, int64
    payload = np.random.default_rng(26).integers(0, 2**62, (2, rows), dtype=np.int64)
    client.put([0, 1], {FIELD: payload})  # indexes 0, 1: warehouse 0, this node
    stored = client.fetch(np.array([0, 1]), [FIELD])[FIELD]
    out = {"payload_bytes": payload.nbytes}
    before, start = links.link_bytes(), time.perf_counter()
    client.put([2, 3], {FIELD: stored})  # indexes 2, 3: warehouse 1, node 1
    out["there_s"], there = time.perf_counter() - start, links.link_bytes() - before
    before, start = links.link_bytes(), time.perf_counter()
    back = client.fetch(np.array([2, 3]), [FIELD])[FIELD]
    out["back_s"], back_bytes = time.perf_counter() - start, links.link_bytes() - before
    out["intact"] = bool(np.array_equal(back.numpy(), payload))
    out["there_links"], out["back_links"] = there.as_dict(), back_bytes.as_dict()
    shutdown_dock(handle)
    return out


#: Calls of each kind per calibration case: link counters count every byte, so a case is
#: repeated and divided, and the counters' own reads (no traffic) cost nothing.
CALIBRATION_REPEATS = 20
#: Seconds between calibration calls: an iteration's calls are this far apart or more, so
#: TCP's delayed ACKs (40 ms) go out on their own instead of riding on the next call.
CALIBRATION_GAP_S = 0.1
#: (samples, fields) of the calibration cases; fields are taken in this order.
CALIBRATION_CASES = [(1, 1), (1, 3), (32, 1), (32, 3)]
CALIBRATION_FIELDS = ["prompt_ids", "response_ids", "reward"]


def calls(token: str) -> dict:
    """Inside node 0: the bytes one remote dock call of each kind puts on the links, with
    its payload and its numpy arrays (Ray frames each array), to measure the framing that
    mindrl.planner.sample_flow adds per message. The stage's controller sits on node 1
    first (a put's announcement stays on node 1), then on node 0 (it crosses)."""
    import numpy as np
    import ray

    from mindrl.dock import RL_FIELDS, DockClient, create_dock, shutdown_dock

    ray.init(logging_level="ERROR", log_to_driver=False)
    links = ShapedCluster(2, token=token)
    here = ray.get_runtime_context().get_node_id()
    there = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != here)
    rng = np.random.default_rng(0)
    rows = []
    for controller in (there, here):
        handle = create_dock(RL_FIELDS, {"s": CALIBRATION_FIELDS}, 64, warehouses=2,
                             controller_nodes={"s": controller})  # fmt: skip
        client = DockClient(handle)
        links.classify_dock(dock_endpoints())
        for samples, n_fields in CALIBRATION_CASES:
            fields = CALIBRATION_FIELDS[:n_fields]
            indexes = np.arange(32, 32 + samples)  # warehouse 1, on node 1
            data = {
                f: rng.random(samples, np.float32) if f == "reward"
                else rng.integers(0, 9, (samples, 4 if f == "prompt_ids" else 3))
                for f in fields
            }  # fmt: skip
            values = sum(np.asarray(v).nbytes for v in data.values())
            for kind in ("put", "fetch"):
                before = links.link_bytes()
                for _ in range(CALIBRATION_REPEATS):
                    if kind == "put":
                        client.put(indexes, data)
                    else:
                        client.fetch(indexes, fields)
                    time.sleep(CALIBRATION_GAP_S)
                if kind == "put":
                    client.handle.warehouses[1].actor.flush.remote()  # announcements out
                    ray.get(client.handle.warehouses[1].actor.flush.remote())
                rows.append(_row(kind, int(controller == here) ^ 1, samples, n_fields, values,
                                 links.link_bytes() - before))  # fmt: skip
            if controller == there and samples == 32:  # a claim crosses to a remote controller
                for size, repeats in ((1, 16), (16, 1)):  # 32 ready samples: 16 x 1, then 16
                    before = links.link_bytes()
                    for _ in range(repeats):
                        client.claim("s", fields, size)
                        time.sleep(CALIBRATION_GAP_S)
                    rows.append(_row("claim", 1, size, n_fields, 0,
                                     links.link_bytes() - before, repeats))  # fmt: skip
            before = links.link_bytes()
            client.clear()
            time.sleep(CALIBRATION_GAP_S)
            rows.append(
                _row("clear", int(controller == here) ^ 1, 0, 0, 0, links.link_bytes() - before, 1)
            )
        shutdown_dock(handle)
    return {"calls": rows}


def _row(kind: str, controller_node: int, samples: int, fields: int, values: int, moved,
         repeats: int = CALIBRATION_REPEATS) -> dict:  # fmt: skip
    return {
        "kind": kind, "controller_node": controller_node, "samples": samples, "fields": fields,
        "values_bytes": values, "up0": moved.up_classes[0]["dock"] / repeats,
        "up1": moved.up_classes[1]["dock"] / repeats,
    }  # fmt: skip


def probe(mb_per_s: float, mib: float, timeout_s: float = 120.0) -> dict:
    """Build the 2-node cluster, run the moves inside node 0, tear down; the report."""
    with ShapedCluster(2, mb_per_s, object_store_mb=max(96, int(8 * mib))) as cluster:
        argv = [str(PYTHON), "-m", "benchmarks.cluster.probe", "--inside", cluster.token,
                "--mib", str(mib)]  # fmt: skip
        done = cluster.run_on(0, argv, timeout_s=timeout_s)
        token = cluster.token
    report = report_line(done.stdout)
    if done.returncode != 0 or report is None:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"the probe driver failed: {tail}")
    report |= {"link_mb_per_s": mb_per_s, "link_s": report["payload_bytes"] / (mb_per_s * 2**20),
               "token": token, "leftovers": cluster.leftovers()}  # fmt: skip
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--link-mb-per-s", type=float, default=16.0)
    parser.add_argument("--mib", type=float, default=8.0, help="payload size (MiB)")
    parser.add_argument(
        "--calls",
        action="store_true",
        help="measure the bytes one remote dock call of each kind adds",
    )
    parser.add_argument("--inside", metavar="TOKEN", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inside:
        report = calls(args.inside) if args.calls else moves(args.mib, args.inside)
        print(REPORT_MARKER + json.dumps(report))
        return 0
    if args.calls:
        with refused_in_one_line(), ShapedCluster(2, args.link_mb_per_s) as cluster:
            argv = [str(PYTHON), "-m", "benchmarks.cluster.probe", "--calls", "--inside",
                    cluster.token]  # fmt: skip
            done = cluster.run_on(0, argv, timeout_s=300)
        report = report_line(done.stdout)
        if done.returncode != 0 or report is None:
            print(f"error: the calibration driver failed: {done.stderr.strip()[-300:]}")
            return 1
        print(json.dumps(report, indent=1))
        return 0
    with refused_in_one_line():
        print(json.dumps(probe(args.link_mb_per_s, args.mib), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
