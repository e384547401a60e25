"""The shaped cluster of benchmarks/cluster: its links carry a dock's payload at their rate,
and nothing of it is left after it exits, also after Ctrl-C.

These tests build their own Ray nodes inside network namespaces, as separate processes
with their own temporary folder and ports: the pytest process never joins them, so the
shared session of tests/conftest.py is neither used nor disturbed.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.cluster.netns import ROOT, ShapedCluster, unavailable_reason

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(bool(unavailable_reason()), reason=f"{unavailable_reason()}"),
]

RATE_MB_PER_S = 16.0
PAYLOAD_MIB = 8.0


def test_a_payload_between_warehouses_takes_the_link_rate_each_way():
    from benchmarks.cluster.probe import probe

    report = probe(RATE_MB_PER_S, PAYLOAD_MIB)
    payload, link_s = report["payload_bytes"], report["link_s"]  # 8 MiB at 16 MiB/s: 0.5 s
    assert report["intact"]
    for move, (sender, receiver) in (("there", (0, 1)), ("back", (1, 0))):
        seconds, links = report[f"{move}_s"], report[f"{move}_links"]
        # Not faster than the link allows (htb lets a 256 KiB burst through), and not
        # slower than it plus Ray's own round trips on a busy 2-core machine.
        assert 0.9 * link_s <= seconds <= 2.0 * link_s + 1.0, (move, seconds, link_s)
        # The payload left the sender's uplink and entered the receiver's downlink once.
        for carried in (links["up"][sender], links["down"][receiver]):
            assert payload <= carried <= 1.05 * payload + 256 * 1024, (move, carried)
        assert links["up_classes"][sender]["objects"] >= payload  # Ray's object transfer
    assert report["leftovers"] == []


def test_nothing_is_left_after_ctrl_c():
    # The network alone (no Ray): the teardown path is the same, and it is quick.
    code = (
        "import sys, time\n"
        "from benchmarks.cluster.netns import ShapedCluster\n"
        "with ShapedCluster(2, 8.0, start_ray=False) as cluster:\n"
        "    print(cluster.token, cluster.tmp, flush=True)\n"
        "    time.sleep(60)\n"
    )
    # A suite started in the background (`cmd &`) inherits SIGINT ignored, and Python then
    # never turns it into KeyboardInterrupt: give the child the default disposition.
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    token, tmp = proc.stdout.readline().split()
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"mrc{token}n1" in names  # it was built
    proc.send_signal(signal.SIGINT)
    # Generous: tearing the namespaces down took over 30 s on the 2-core box under load.
    assert proc.wait(timeout=120) != 0
    cluster = ShapedCluster(2, token=token)
    cluster.tmp = Path(tmp)
    assert cluster.leftovers() == []


def test_an_error_inside_tears_the_cluster_down():
    with pytest.raises(ZeroDivisionError), ShapedCluster(2, 8.0, start_ray=False) as cluster:
        assert cluster.tmp.exists()
        started = time.monotonic()
        cluster.popen(1, ["sleep", "60"])  # a process inside node 1's namespace
        raise ZeroDivisionError("an error inside the cluster's block")
    assert cluster.leftovers() == []
    assert time.monotonic() - started < 15  # the sleeping process was killed, not waited for
