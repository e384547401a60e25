"""benchmarks/cluster/linearity.py's report: linearity, the busiest link's share and the
bound, from the flow driver's measurements (no cluster: the figures are given)."""

from __future__ import annotations

import pytest

from benchmarks.cluster.linearity import parse_args, summarize

MIB = 2**20


def flow_report(seconds: float, ups: list[int], downs: list[int], compute_s: float) -> dict:
    """What benchmarks/cluster/flow.py prints for the dock alone: two identical runs."""
    run = {"seconds": seconds, "links": {"up": ups, "down": downs}}
    return {
        "samples_per_node": 32,
        "compute_s": {"update": compute_s},
        "runs": {"td": [run, run]},
        "median_s": {"td": seconds},
    }


def measured_one_and_two_nodes() -> dict:
    return {
        1: {
            "shaped": flow_report(8.0, [0], [0], compute_s=7.5),
            "unshaped": flow_report(0.3, [0], [0], compute_s=0.0),
        },
        2: {
            # Node 0 sends 1 MiB and receives 3 MiB; the dispatch, 2.5 s, is 0.5 s on
            # unshaped links: the links add 2 s.
            "shaped": flow_report(10.0, [MIB, 3 * MIB], [3 * MIB, MIB], compute_s=7.5),
            "unshaped": flow_report(0.5, [MIB, 3 * MIB], [3 * MIB, MIB], compute_s=0.0),
        },
    }


def test_linearity_is_throughput_per_node_against_one_node_and_names_the_link_bound():
    report = summarize(measured_one_and_two_nodes(), mb_per_s=1.0)

    one, two = report["td"]["1"], report["td"]["2"]
    assert one["throughput_per_node"] == pytest.approx(32 / 8.0)
    assert two["linearity"] == pytest.approx(8.0 / 10.0)
    assert two["dispatch_s"] == pytest.approx(2.5)
    assert two["busiest_link_s"] == pytest.approx(3.0)
    # Node 1's link carries 3 + 1 MiB of the 4 MiB that crossed between the two nodes.
    assert two["busiest_link_share"] == pytest.approx(1.0)
    assert two["bound"] == "link"
    assert report["bound"] == "link"
    assert "central" not in report


def test_a_dispatch_the_links_add_little_to_is_cpu_bound_however_busy_a_link():
    measured = measured_one_and_two_nodes()
    # The same flow takes 1.5 s on unshaped links: the links add 1 s to the 2.5 s, while
    # the busiest link's bytes at the rate (3 s) would take longer than either.
    measured[2]["unshaped"]["median_s"]["td"] = 1.5

    report = summarize(measured, mb_per_s=1.0)

    assert report["td"]["2"]["busiest_link_s"] == pytest.approx(3.0)
    assert report["td"]["2"]["bound"] == "cpu"
    assert report["bound"] == "cpu"


def test_systems_outside_the_two_compared_are_refused(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--systems", "td,verl"])

    assert "--systems" in capsys.readouterr().err
