"""Communication cost: all-reduce, all-gather and send/recv time from bytes, GPUs and topology.

What: the time of one collective call on `workers` GPUs moving a buffer of `nbytes` per GPU is

    t = latency_s + traffic_bytes / (link_bytes_per_s * e(traffic_bytes))
    e(x) = eff_max / (1 + (ramp_bytes / x) ** ramp_exponent)

with the ring algorithms' traffic per GPU (Patarasuk and Yuan, JPDC 2009; NCCL's "bus bandwidth"
convention): all-reduce 2 (n - 1) / n x bytes, all-gather (n - 1) / n x bytes (bytes = the
gathered output), send/recv the bytes once. `link_bytes_per_s` is one direction of the slowest
link the ring crosses, read from the part's catalog fields and the node topology:

    nvswitch      any GPUs of a node, full NVLink bandwidth each (interconnect_bytes_per_s / 2)
    nvlink_pairs  2 GPUs of a pair over their NVLink bridge; more cross PCIe (pcie_bytes_per_s / 2)
    pcie          PCIe between every pair (pcie_bytes_per_s / 2)
    mesh          point-to-point links to every other GPU of the node (Infinity Fabric): a ring
                  on n of G GPUs drives n - 1 of its G - 1 links
    > one node    hierarchical: the node's own collective, then a ring between nodes over each
                  GPU's NIC (network_bytes_per_s) carrying 1/G of the buffer

The achieved efficiency ramps up with the traffic (NCCL's protocols and channel count grow with
the message; small calls are latency-bound). Its four numbers are fitted per *path* (nvswitch,
nvlink, pcie, network) and per algorithm family (ring collectives, point-to-point), never per
part: `fit()` calibrates them on the measured A100 collectives in `simulator/data/vidur-a100/
network/` (an NVSwitch DGX and NVLink pairs, within one node; DGX send/recv across two nodes for
the network path) on every other buffer size; `evaluate()` reports the error on the sizes the fit
did not see. The result ships in `simulator/data/comm_calibration.json`.

    python -m simulator.comm            # refit, write the JSON, print held-out errors (one JSON line)
    collective_time_s("all_reduce", 2**20, 8, get_hardware("h100-sxm"))
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from profiler.errors import UsageError, is_count
from simulator.hardware import TOPOLOGIES, HardwareSpec, get_hardware

Number = float | np.ndarray

COLLECTIVES = ("all_reduce", "all_gather", "send_recv")
PATHS = ("nvswitch", "nvlink", "pcie", "network")
FAMILY = {"all_reduce": "ring", "all_gather": "ring", "send_recv": "p2p"}
DATA_DIR = Path(__file__).parent / "data" / "vidur-a100" / "network"
PARAMS_PATH = Path(__file__).parent / "data" / "comm_calibration.json"
# The measured systems, described by catalog fields (not by name): which part, which topology.
MEASURED = {"dgx": ("a100-80g", "nvswitch"), "pairwise_nvlink": ("a100-80g", "nvlink_pairs")}


@dataclass(frozen=True)
class Ramp:
    """Latency and efficiency ramp of one (path, family)."""

    eff_max: float  # fraction of the link's one-way bandwidth reached by very large calls
    ramp_bytes: float  # traffic at which half of eff_max is reached (exponent 1)
    ramp_exponent: float
    latency_s: float


@dataclass(frozen=True)
class CommParams:
    """Ramps per path and family: `ramps[path][family]`."""

    ramps: dict
    source: str = ""

    def ramp(self, path: str, family: str) -> Ramp:
        return self.ramps[path][family]

    def to_json(self) -> dict:
        return {
            "source": self.source,
            "ramps": {p: {f: asdict(r) for f, r in fams.items()} for p, fams in self.ramps.items()},
        }

    @classmethod
    def from_json(cls, data: dict) -> CommParams:
        return cls(
            {p: {f: Ramp(**r) for f, r in fams.items()} for p, fams in data["ramps"].items()}, data.get("source", "")
        )


@functools.lru_cache(maxsize=1)
def load_params() -> CommParams:
    """The shipped calibration (`python -m simulator.comm` rewrites it)."""
    with PARAMS_PATH.open(encoding="utf-8") as handle:
        return CommParams.from_json(json.load(handle))


def traffic_bytes(collective: str, nbytes: Number, workers: int) -> Number:
    """Bytes each GPU sends in one call (ring algorithms)."""
    n = workers
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n * nbytes
    if collective == "all_gather":
        return (n - 1) / n * nbytes
    if collective == "send_recv":
        return 1.0 * nbytes
    raise UsageError(f"unknown collective {collective!r}; valid: {', '.join(COLLECTIVES)}")


def link(hardware: HardwareSpec, workers: int, topology: str | None = None) -> tuple[str, float]:
    """(path, one-way bytes/s) of the slowest link a ring of `workers` GPUs of one node crosses."""
    topo = topology or hardware.topology
    if topo not in TOPOLOGIES:
        raise UsageError(f"unknown topology {topo!r}; valid: {', '.join(TOPOLOGIES)}")
    nvlink = hardware.interconnect_bytes_per_s / 2
    if topo == "nvswitch":
        return "nvswitch", nvlink
    if topo == "nvlink_pairs":
        return ("nvlink", nvlink) if workers <= 2 else ("pcie", hardware.pcie_bytes_per_s / 2)
    if topo == "mesh":
        links = max(hardware.gpus_per_node - 1, 1)
        return "nvlink", nvlink * min(workers - 1, links) / links
    return "pcie", hardware.pcie_bytes_per_s / 2


def _ramp_time_s(ramp: Ramp, traffic: Number, bytes_per_s: float) -> Number:
    traffic = np.maximum(traffic, 1.0) if isinstance(traffic, np.ndarray) else max(traffic, 1.0)
    eff = ramp.eff_max / (1.0 + (ramp.ramp_bytes / traffic) ** ramp.ramp_exponent)
    return ramp.latency_s + traffic / (bytes_per_s * eff)


def collective_time_s(
    collective: str,
    nbytes: Number,
    workers: int,
    hardware: HardwareSpec,
    topology: str | None = None,
    params: CommParams | None = None,
    across_nodes: bool = False,
) -> Number:
    """Seconds of one call. `nbytes`: the buffer per GPU (all-gather: its output).

    send/recv on n workers: every GPU sends `nbytes` to its neighbour at once (a pipeline's stage
    boundaries, a ring shift): one pair's time on the link a ring of n crosses, the NICs when n
    GPUs fill more than one node. `across_nodes`: a send/recv between two nodes, over the NICs.
    """
    if collective not in COLLECTIVES:
        raise UsageError(f"unknown collective {collective!r}; valid: {', '.join(COLLECTIVES)}")
    if not is_count(workers):
        raise UsageError(f"workers must be a positive integer, got {workers!r}")
    if np.any(np.asarray(nbytes) < 0):
        raise UsageError(f"bytes must be >= 0, got {nbytes!r}")
    params = params or load_params()
    family = FAMILY[collective]
    if workers == 1 and collective != "send_recv":
        return 0.0 * nbytes
    if collective == "send_recv":
        # a ring of more GPUs than a node holds crosses the NICs (was: timed on the node's link)
        if across_nodes or hardware.gpus_per_node < 2 or workers > hardware.gpus_per_node:
            return _ramp_time_s(params.ramp("network", family), nbytes, hardware.network_bytes_per_s)
        path, bytes_per_s = link(hardware, max(workers, 2), topology)
        return _ramp_time_s(params.ramp(path, family), nbytes, bytes_per_s)
    per_node = hardware.gpus_per_node
    if workers <= per_node:
        path, bytes_per_s = link(hardware, workers, topology)
        return _ramp_time_s(params.ramp(path, family), traffic_bytes(collective, nbytes, workers), bytes_per_s)
    if workers % per_node:
        raise UsageError(f"{workers} GPUs do not fill whole nodes of {per_node}")
    nodes = workers // per_node
    inside = collective_time_s(collective, nbytes, per_node, hardware, topology, params)
    between = _ramp_time_s(
        params.ramp("network", family),
        traffic_bytes(collective, nbytes / per_node, nodes),
        hardware.network_bytes_per_s,
    )
    return inside + between


# ---- calibration ---------------------------------------------------------------------------------
def measured_rows() -> dict[str, np.ndarray]:
    """The A100 collectives as flat arrays: system, collective, workers, bytes, median seconds,
    across_nodes, and a held-out flag (every other buffer size of each series; the rows of a size
    measured twice fall in the same half)."""
    import pandas as pd

    frames = []
    for system in MEASURED:
        for collective in ("all_reduce", "send_recv"):
            d = pd.read_csv(DATA_DIR / f"{system}.{collective}.csv")
            d = pd.DataFrame(
                {
                    "system": system,
                    "collective": collective,
                    "workers": d["num_workers"],
                    "per_node": d["devices_per_node"],
                    "bytes": d["size"].astype(float),
                    "time_s": d[f"time_stats.{collective}.median"] * 1e-3,
                }
            )
            # within one node; plus the DGX's one-GPU-per-node send/recv for the network path
            # (the pairwise system's network is not described by its source)
            keep = (d["per_node"] == d["workers"]) | (
                (system == "dgx") & (collective == "send_recv") & (d["per_node"] == 1)
            )
            frames.append(d[keep])
    d = pd.concat(frames, ignore_index=True).sort_values(["system", "collective", "workers", "per_node", "bytes"])
    series = ["system", "collective", "workers", "per_node"]
    d["held_out"] = d.groupby(series).cumcount() % 2 == 1
    # a size measured twice in a series (16 MiB is, in each) stays in one half, the first row's:
    # the held-out rows are sizes the fit did not see
    d["held_out"] = d.groupby([*series, "bytes"])["held_out"].transform("first")
    d["across_nodes"] = d["per_node"] < d["workers"]
    return {
        c: d[c].to_numpy() for c in ("system", "collective", "workers", "bytes", "time_s", "held_out", "across_nodes")
    }


def _series(rows: dict[str, np.ndarray]) -> list[tuple[tuple, np.ndarray]]:
    """(system, collective, workers, across_nodes) of each measured series, with its rows."""
    keys = zip(rows["system"], rows["collective"], rows["workers"], rows["across_nodes"])
    out = []
    for key in sorted(set(keys)):
        system, collective, workers, across = key
        sel = (
            (rows["system"] == system)
            & (rows["collective"] == collective)
            & (rows["workers"] == workers)
            & (rows["across_nodes"] == across)
        )
        out.append((key, sel))
    return out


def predict_rows(
    rows: dict[str, np.ndarray], params: CommParams, series: list[tuple[tuple, np.ndarray]] | None = None
) -> np.ndarray:
    """The model's time of every measured row; `series`: `_series(rows)`, when a fit asks again and again."""
    out = np.zeros(len(rows["bytes"]))
    for (system, collective, workers, across), sel in series if series is not None else _series(rows):
        part, topology = MEASURED[system]
        out[sel] = collective_time_s(
            collective,
            rows["bytes"][sel],
            int(workers),
            get_hardware(part),
            topology,
            params,
            across_nodes=bool(across),
        )
    return out


# (path, family) pairs the data identifies; the others copy their neighbour's fit
_FITTED = (
    ("nvswitch", "ring"),
    ("nvswitch", "p2p"),
    ("nvlink", "ring"),
    ("nvlink", "p2p"),
    ("pcie", "ring"),
    ("network", "p2p"),
)
_COPIED = {("pcie", "p2p"): ("pcie", "ring"), ("network", "ring"): ("network", "p2p")}


def _unpack(x: np.ndarray) -> CommParams:
    ramps: dict = {path: {} for path in PATHS}
    eff = {path: x[i] for i, path in enumerate(("nvswitch", "nvlink", "pcie", "network"))}
    for j, (path, family) in enumerate(_FITTED):
        log_ramp, exponent, latency_us = x[4 + 3 * j : 7 + 3 * j]
        ramps[path][family] = Ramp(float(eff[path]), float(np.exp(log_ramp)), float(exponent), float(latency_us) * 1e-6)
    for (path, family), (src_path, src_family) in _COPIED.items():
        ramps[path][family] = ramps[src_path][src_family]
    return CommParams(ramps)


def fit(rows: dict[str, np.ndarray] | None = None) -> CommParams:
    """Least squares on relative error (soft L1: a few noisy small calls do not steer it) over the
    rows not held out."""
    from scipy.optimize import least_squares

    rows = rows or measured_rows()
    train = {k: v[~rows["held_out"]] for k, v in rows.items()}
    n_fit = len(_FITTED)
    x0 = np.array([0.7] * 4 + [np.log(1e6), 1.0, 20.0] * n_fit)
    lower = np.array([0.05] * 4 + [np.log(1e3), 0.2, 0.0] * n_fit)
    upper = np.array([1.0] * 4 + [np.log(1e9), 1.0, 500.0] * n_fit)  # exponent <= 1: time never falls with bytes
    series = _series(train)
    result = least_squares(
        lambda x: predict_rows(train, _unpack(x), series) / train["time_s"] - 1.0,
        x0,
        bounds=(lower, upper),
        loss="soft_l1",
        f_scale=0.1,
    )
    params = _unpack(result.x)
    return CommParams(params.ramps, source="fit on the vidur A100 collectives (every other buffer size)")


def evaluate(params: CommParams | None = None, rows: dict[str, np.ndarray] | None = None) -> dict:
    """Mean absolute percentage error on the held-out buffer sizes, overall and per series."""
    params = params or load_params()
    rows = rows or measured_rows()
    held = rows["held_out"]
    measured = _series(rows)
    ape = np.abs(predict_rows(rows, params, measured) / rows["time_s"] - 1.0) * 100
    series = {}
    for (system, collective, workers, across), sel in measured:
        if not (sel & held).any():
            continue
        name = f"{system}.{collective}.n{workers}" + (".across_nodes" if across else "")
        series[name] = round(float(ape[sel & held].mean()), 2)
    within = held & ~rows["across_nodes"]
    big = within & (rows["bytes"] >= 2**20)
    return {
        "comm_mape_percent": round(float(ape[within].mean()), 2),
        "comm_mape_percent_1mib_up": round(float(ape[big].mean()), 2),
        "comm_mape_percent_network": round(float(ape[held & rows["across_nodes"]].mean()), 2),
        "held_out_rows": int(within.sum()),
        "series": series,
    }


def main() -> int:
    rows = measured_rows()
    params = fit(rows)
    PARAMS_PATH.write_text(json.dumps(params.to_json(), indent=1) + "\n", encoding="utf-8")
    load_params.cache_clear()
    print(json.dumps({"wrote": str(PARAMS_PATH), **evaluate(params, rows)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
