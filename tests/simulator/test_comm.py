"""Communication model: calibrated on the A100 collectives, shaped by links and topology only."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from profiler.errors import UsageError
from simulator.comm import (
    PATHS,
    CommParams,
    Ramp,
    _unpack,
    collective_time_s,
    evaluate,
    fit,
    link,
    load_params,
    measured_rows,
    predict_rows,
    traffic_bytes,
)
from simulator.hardware import get_hardware
from solm.cli import main


def test_held_out_error_of_the_shipped_fit() -> None:
    report = evaluate()
    assert report["held_out_rows"] > 1000
    assert report["comm_mape_percent"] <= 10.0  # buffer sizes the fit did not see
    assert all(mape < 20 for mape in report["series"].values())


def test_the_shipped_fit_is_what_the_refit_writes() -> None:
    """`python -m simulator.comm` refits the shipped JSON: the refit predicts every measured call
    (the fitted sizes and the held-out ones) as the shipped parameters do. Compared on predictions,
    not parameters: a ramp whose exponent sits at its bound leaves its ramp size loosely pinned."""
    rows = measured_rows()
    shipped, refit = predict_rows(rows, load_params()), predict_rows(rows, fit(rows))
    np.testing.assert_allclose(refit, shipped, rtol=0.01)


def test_ring_traffic_and_trivial_calls() -> None:
    assert traffic_bytes("all_reduce", 800, 4) == 1200 and traffic_bytes("all_gather", 800, 4) == 600
    h100 = get_hardware("h100-sxm")
    assert collective_time_s("all_reduce", 2**20, 1, h100) == 0.0
    sizes = np.array([0, 2**10, 2**16, 2**20, 2**24, 2**28], float)
    for collective in ("all_reduce", "all_gather", "send_recv"):
        times = collective_time_s(collective, sizes, 8, h100)
        assert np.all(np.diff(times) > 0)  # more bytes never faster
        assert times[0] > 0  # a call costs its latency


def test_only_links_and_topology_matter_not_the_name() -> None:
    h100 = get_hardware("h100-sxm")
    twin = dataclasses.replace(h100, name="made-up")
    assert collective_time_s("all_reduce", 2**24, 8, twin) == collective_time_s("all_reduce", 2**24, 8, h100)
    faster = dataclasses.replace(h100, interconnect_bytes_per_s=2 * h100.interconnect_bytes_per_s)
    assert collective_time_s("all_reduce", 2**26, 8, faster) < collective_time_s("all_reduce", 2**26, 8, h100)


def test_topology_picks_the_slowest_link() -> None:
    a100 = get_hardware("a100-80g")
    assert link(a100, 4, "nvswitch") == ("nvswitch", 300e9)
    assert link(a100, 2, "nvlink_pairs") == ("nvlink", 300e9) and link(a100, 4, "nvlink_pairs") == ("pcie", 32e9)
    pairs = collective_time_s("all_reduce", 2**26, 4, a100, "nvlink_pairs")
    assert pairs > 5 * collective_time_s("all_reduce", 2**26, 4, a100, "nvswitch")
    mi = get_hardware("mi300x")
    assert link(mi, 8)[1] == pytest.approx(448e9) and link(mi, 2)[1] == pytest.approx(64e9)
    one_node = collective_time_s("all_reduce", 2**26, 8, get_hardware("h100-sxm"))
    two_nodes = collective_time_s("all_reduce", 2**26, 16, get_hardware("h100-sxm"))
    assert two_nodes > one_node
    with pytest.raises(ValueError):
        collective_time_s("all_reduce", 2**20, 12, get_hardware("h100-sxm"))  # not whole nodes
    with pytest.raises(ValueError):
        collective_time_s("broadcast", 2**20, 2, a100)


def test_solm_cost_comm_json(capsys) -> None:
    assert (
        main(
            [
                "cost",
                "--hardware",
                "h100-sxm",
                "--comm",
                "all_reduce,send_recv",
                "--workers",
                "2,4,8",
                "--bytes",
                "4096,1048576,67108864",
                "--json",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    rows = json.loads(out[0])["comm"]
    assert len(rows) == 18 and set(rows[0]) == {"collective", "workers", "bytes", "time_ms"}
    assert all(row["time_ms"] > 0 for row in rows)
    assert main(["cost", "--hardware", "h100-sxm", "--comm", "bcast"]) == 2
    assert main(["cost", "--hardware", "h100-sxm", "--comm", "all_reduce", "--workers", "16"]) == 2
    assert main(["cost", "--hardware", "h100-sxm"]) == 2  # no --model, no --comm
    assert "error" in capsys.readouterr().err


def test_across_nodes_the_ring_between_nodes_carries_a_gpus_share_after_the_nodes_own() -> None:
    """16 H100s in 2 nodes of 8: the node's all-reduce, then a 2-node ring over the NICs carrying
    1/8 of the buffer (its traffic 2 (2 - 1) / 2 x B / 8; the network ring copies the network
    send/recv fit, so it is a send/recv of B / 8 across nodes), the two one after the other."""
    h100 = get_hardware("h100-sxm")
    for nbytes in (2**16, 2**26):
        inside = collective_time_s("all_reduce", nbytes, 8, h100)
        between = collective_time_s("send_recv", nbytes / 8, 2, h100, across_nodes=True)
        assert collective_time_s("all_reduce", nbytes, 16, h100) == pytest.approx(inside + between, rel=1e-12)
    assert between > collective_time_s("send_recv", nbytes / 8, 2, h100)  # NICs are slower than NVLink


def test_send_recv_on_one_gpu_takes_a_pairs_link() -> None:
    """A send/recv is one pair's time on its link, also when named for 1 worker (a mesh part's
    link count for a ring of 1 would be 0)."""
    for part in ("mi300x", "a100-80g"):
        hw = get_hardware(part)
        assert collective_time_s("send_recv", 2**20, 1, hw) == collective_time_s("send_recv", 2**20, 2, hw)


def _series(rows: dict) -> list[np.ndarray]:
    keys = set(zip(rows["system"], rows["collective"], rows["workers"], rows["across_nodes"]))
    return [
        (rows["system"] == s) & (rows["collective"] == c) & (rows["workers"] == w) & (rows["across_nodes"] == a)
        for s, c, w, a in sorted(keys)
    ]


def test_held_out_sizes_are_sizes_the_fit_did_not_see() -> None:
    """Each measured series is split into two halves of its buffer sizes: no size is in both (the
    A100 data times 16 MiB twice per series; one row was fitted, the other held out), and each half
    holds about half the series."""
    rows = measured_rows()
    held = rows["held_out"]
    for sel in _series(rows):
        assert not set(rows["bytes"][sel & held]) & set(rows["bytes"][sel & ~held])
        assert abs(int((sel & held).sum()) - int((sel & ~held).sum())) <= 2


def test_ring_traffic_for_any_worker_count() -> None:
    """Bytes each GPU sends (ring algorithms): all-reduce 2 (n - 1) / n B, all-gather (n - 1) / n B,
    send/recv B whatever n; `solm cost --comm`'s bus bandwidth divides by it."""
    nbytes = 3 * 2**20
    for n in range(1, 17):
        assert traffic_bytes("all_reduce", nbytes, n) == pytest.approx(2 * (n - 1) / n * nbytes, rel=1e-12)
        assert traffic_bytes("all_gather", nbytes, n) == pytest.approx((n - 1) / n * nbytes, rel=1e-12)
        assert traffic_bytes("send_recv", nbytes, n) == nbytes
    with pytest.raises(UsageError, match="unknown collective 'broadcast'"):
        traffic_bytes("broadcast", nbytes, 2)


def test_each_topology_takes_its_documented_link() -> None:
    """nvswitch: half the NVLink aggregate, any n; nvlink_pairs: NVLink for a pair, PCIe beyond;
    pcie: half the PCIe aggregate for any n, on the PCIe ramp; mesh: n - 1 of the G - 1
    point-to-point links, on the NVLink ramp (point-to-point links, like a pair's bridge)."""
    base = get_hardware("h100-sxm")
    nvlink, pcie = base.interconnect_bytes_per_s / 2, base.pcie_bytes_per_s / 2
    g = base.gpus_per_node
    for n in range(2, g + 1):
        assert link(base, n, "nvswitch") == ("nvswitch", nvlink)
        assert link(base, n, "nvlink_pairs") == (("nvlink", nvlink) if n == 2 else ("pcie", pcie))
        assert link(base, n, "pcie") == ("pcie", pcie)
        path, bytes_per_s = link(base, n, "mesh")
        assert path == "nvlink" and bytes_per_s == pytest.approx(nvlink * (n - 1) / (g - 1), rel=1e-12)
    for topology in ("pcie", "mesh"):  # the part's own topology when none is named
        part = dataclasses.replace(base, topology=topology)
        assert link(part, 4) == link(base, 4, topology)
    with pytest.raises(UsageError, match="unknown topology 'torus'"):
        link(base, 4, "torus")


def _distinct_params() -> CommParams:
    """A ramp of its own for each (path, family), so a time names the ramp that made it."""
    ramps: dict = {}
    for i, path in enumerate(PATHS):
        ramps[path] = {}
        for j, family in enumerate(("ring", "p2p")):
            k = 2 * i + j
            ramps[path][family] = Ramp(0.4 + 0.07 * k, 1e4 * (k + 1), 0.5 + 0.06 * k, 1e-6 * (k + 1))
    return CommParams(ramps)


def _formula(ramp: Ramp, traffic: float, bytes_per_s: float) -> float:
    traffic = max(traffic, 1.0)
    eff = ramp.eff_max / (1 + (ramp.ramp_bytes / traffic) ** ramp.ramp_exponent)
    return ramp.latency_s + traffic / (bytes_per_s * eff)


def test_a_call_is_latency_plus_traffic_over_its_ramped_link() -> None:
    """t = latency + traffic / (link x e(traffic)) with the given parameters' ramp of the path and
    the family (ring collectives, point-to-point); across nodes, the node's own collective on its
    topology, then a ring between nodes over the NICs carrying 1 / G of the buffer."""
    params = _distinct_params()
    h100 = get_hardware("h100-sxm")
    g, nic = h100.gpus_per_node, h100.network_bytes_per_s
    nbytes = 5e6
    for topology in ("nvswitch", "nvlink_pairs", "pcie", "mesh"):
        path, bw = link(h100, 4, topology)
        for collective in ("all_reduce", "all_gather"):
            expected = _formula(params.ramp(path, "ring"), traffic_bytes(collective, nbytes, 4), bw)
            assert collective_time_s(collective, nbytes, 4, h100, topology, params) == pytest.approx(expected)
        expected = _formula(params.ramp(path, "p2p"), nbytes, bw)
        assert collective_time_s("send_recv", nbytes, 4, h100, topology, params) == pytest.approx(expected)
        inside = _formula(
            params.ramp(link(h100, g, topology)[0], "ring"),
            traffic_bytes("all_reduce", nbytes, g),
            link(h100, g, topology)[1],
        )
        between = _formula(params.ramp("network", "ring"), traffic_bytes("all_reduce", nbytes / g, 2), nic)
        two_nodes = collective_time_s("all_reduce", nbytes, 2 * g, h100, topology, params)
        assert two_nodes == pytest.approx(inside + between)
    across = collective_time_s("send_recv", nbytes, 2, h100, params=params, across_nodes=True)
    assert across == pytest.approx(_formula(params.ramp("network", "p2p"), nbytes, nic))


def test_zero_bytes_cost_a_one_byte_call_scalar_or_array() -> None:
    """Traffic is floored at 1 byte: an empty buffer costs the call's latency, given as a number
    or in an array (a number too: else ramp_bytes / 0)."""
    h100 = get_hardware("h100-sxm")
    for collective in ("all_reduce", "all_gather", "send_recv"):
        scalar = collective_time_s(collective, 0, 8, h100)
        assert np.isfinite(scalar) and scalar == collective_time_s(collective, np.array([0.0]), 8, h100)[0]
        assert 0 < scalar <= collective_time_s(collective, 1, 8, h100)  # the call's latency, about


def test_one_worker_moves_nothing_for_each_size() -> None:
    sizes = np.array([0.0, 2**10, 2**20])
    times = collective_time_s("all_reduce", sizes, 1, get_hardware("h100-sxm"))
    assert np.shape(times) == sizes.shape and not np.any(times)


@pytest.mark.parametrize("workers", [0, -2, 2.0, 2.5, "2"])
def test_workers_must_be_a_positive_integer(workers) -> None:
    with pytest.raises(UsageError, match="workers must be a positive integer"):
        collective_time_s("all_reduce", 2**20, workers, get_hardware("h100-sxm"))


def test_send_recv_leaves_the_node_only_when_it_must() -> None:
    """A part of one GPU per node has no node link: its send/recv crosses the NICs. A node of 2
    GPUs has one: a send/recv within it takes the node's link, not the NICs."""
    h100 = get_hardware("h100-sxm")
    one = dataclasses.replace(h100, gpus_per_node=1)
    assert collective_time_s("send_recv", 2**24, 2, one) == collective_time_s(
        "send_recv", 2**24, 2, h100, across_nodes=True
    )
    two = dataclasses.replace(h100, gpus_per_node=2)
    assert collective_time_s("send_recv", 2**24, 2, two) == collective_time_s("send_recv", 2**24, 2, h100)
    assert collective_time_s("send_recv", 2**24, 2, two) < collective_time_s(
        "send_recv", 2**24, 2, two, across_nodes=True
    )


def test_evaluate_averages_the_held_out_rows_only() -> None:
    """Measured times set so each row's error is known: the headline figure averages the held-out
    rows within one node, '1 MiB up' those of them from 2**20 bytes on, the network figure the
    held-out rows across nodes, each series its own held-out rows; the fitted rows count nowhere."""
    params = load_params()
    rows = dict(measured_rows())
    error = np.random.default_rng(0).uniform(0.0, 0.5, len(rows["bytes"]))
    rows["time_s"] = predict_rows(rows, params) / (1 + error)
    report = evaluate(params, rows)
    held, across = rows["held_out"], rows["across_nodes"]
    within = held & ~across

    def percent(sel: np.ndarray) -> float:
        return pytest.approx(100 * error[sel].mean(), abs=0.006)

    assert report["comm_mape_percent"] == percent(within)
    assert report["comm_mape_percent_1mib_up"] == percent(within & (rows["bytes"] >= 2**20))
    assert report["comm_mape_percent_network"] == percent(held & across)
    assert report["held_out_rows"] == int(within.sum())
    expected = sorted(100 * error[held & sel].mean() for sel in _series(rows))
    assert sorted(report["series"].values()) == pytest.approx(expected, abs=0.006)


def test_a_path_without_its_own_data_copies_its_neighbour() -> None:
    """The data has no send/recv over PCIe and no ring over the network: the PCIe send/recv takes
    PCIe's ring fit (same link, its latency and efficiency), the network ring the network
    send/recv's; and both families of a path share its efficiency ceiling."""
    x = np.linspace(0.3, 0.9, 4 + 3 * 6)
    params = _unpack(x)
    assert params.ramp("pcie", "p2p") == params.ramp("pcie", "ring")
    assert params.ramp("network", "ring") == params.ramp("network", "p2p")
    for path in PATHS:
        assert params.ramp(path, "ring").eff_max == params.ramp(path, "p2p").eff_max
    assert len({params.ramp(path, "ring").eff_max for path in PATHS}) == len(PATHS)
