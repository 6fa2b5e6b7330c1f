"""The GEMM cost model checked on parts it was never fitted on: measured H100, H200 and B200 tables.

What: `simulator/data/xla-gemm/` holds OpenXLA's public matmul performance tables for an
SXM-class H100 and a B200 (bf16, m, n, k each 256..4096: 125 GEMMs per part; its README says
where they come from); `simulator/data/h200-gemm/` holds the project's own H200 measurement
(bench/gemm_profile.py on the GPU run: 512 bf16 GEMMs of LLM projection shapes at 1-8192
tokens, kernel time from CUDA-graph replays; its README says how). `load_part` reads one part's
tables as rows of (M, K, N, time_s);
`transfer_errors` scores the tile-and-wave model (`simulator.gemm`, fitted on the A100 only),
the old per-family roofline (its fused gate+up family, the one fitted on the widest GEMMs) and a
datasheet roofline (peak FLOP/s, HBM bandwidth) on them: median and p90 absolute percentage error
and the median signed error, over every GEMM and over those that take more than 10 us (below
that, a fixed ~5 us launch or measurement cost in XLA's tables dominates).

Why: the model's promise is hardware you do not have; the A100 folds (`simulator.gemm_fit`)
only test new shapes on the part it was fitted on. Nothing here is fitted: the tables only judge.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simulator.cost import CostParams, default_params, op_time_s
from simulator.gemm import GemmParams, KernelTimes, gemm_kernel
from simulator.hardware import HARDWARE, HardwareSpec

XLA_DIR = Path(__file__).resolve().parent / "data" / "xla-gemm"
XLA_PARTS: dict[str, str] = {"h100-sxm": "h100-sxm.csv", "b200": "b200.csv"}  # catalog part -> table
MEASURED_DIR = Path(__file__).resolve().parent / "data" / "h200-gemm"
MEASURED_PARTS: dict[str, tuple[str, ...]] = {"h200": ("grid.csv", "between.csv")}  # bench/gemm_profile.py CSVs
TRANSFER_PARTS: tuple[str, ...] = (*XLA_PARTS, *MEASURED_PARTS)
KERNEL_MIN_S = 10e-6  # GEMMs above this are judged on the kernel, not the tables' fixed cost
# ... and above this, the XLA tables' fixed cost of about 5 us (their smallest GEMMs' time, which
# a kernel model leaves out) is a quarter of the time or less
LONG_KERNEL_MIN_S = 20e-6


def load_xla(part: str, data_dir: Path | None = None) -> pd.DataFrame:
    """One part's table as rows of M, K, N and time_s (bf16, batch 1)."""
    table = pd.read_csv((data_dir or XLA_DIR) / XLA_PARTS[part])
    return pd.DataFrame(
        {
            "M": table["m"].astype(float),
            "K": table["k"].astype(float),
            "N": table["n"].astype(float),
            "time_s": 2.0 * table["m"] * table["n"] * table["k"] / table["bf16_flops_per_s"],
        }
    )


def table_paths(part: str) -> list[Path]:
    """The measured table(s) of one of `TRANSFER_PARTS`."""
    if part in XLA_PARTS:
        return [XLA_DIR / XLA_PARTS[part]]
    return [MEASURED_DIR / name for name in MEASURED_PARTS[part]]


def gemm_table(part: str) -> pd.DataFrame:
    """One of `TRANSFER_PARTS`'s tables pooled, as `solm calibrate` reads them (`read_gemm_table`:
    rows of num_tokens, K, N, time_s)."""
    from simulator.gemm_calibration import read_gemm_table

    return pd.concat([read_gemm_table(path) for path in table_paths(part)], ignore_index=True)


def load_part(part: str) -> pd.DataFrame:
    """One of `TRANSFER_PARTS` as rows of M, K, N and time_s (XLA's tables through `load_xla`, the
    project's own through `gemm_table`)."""
    if part in XLA_PARTS:
        return load_xla(part)
    return gemm_table(part).rename(columns={"num_tokens": "M"})[["M", "K", "N", "time_s"]]


def tile_kernels(rows: pd.DataFrame, hw: HardwareSpec, params: CostParams) -> list[KernelTimes]:
    """The tile model's kernel for every row (columns M, K, N)."""
    assert params.gemm is not None, "GPU params carry the tile model"
    return [gemm_kernel(r.M, r.K, r.N, hw, params.gemm) for r in rows.itertuples()]


def predictions(rows: pd.DataFrame, hw: HardwareSpec, params: CostParams) -> dict[str, np.ndarray]:
    """Seconds each model predicts for every row: tile model, old per-family roofline, datasheet."""
    tiles = np.array([float(kernel.time_s) for kernel in tile_kernels(rows, hw, params)])
    flops = (2.0 * rows["M"] * rows["K"] * rows["N"]).to_numpy(float)
    hbm = (2.0 * (rows["M"] * rows["K"] + rows["K"] * rows["N"] + rows["M"] * rows["N"])).to_numpy(float)
    work = (flops, hbm, np.ones(len(rows)))
    old = np.asarray(op_time_s(work, rows["M"].to_numpy(float), params.families["up_proj"], hw, params.smooth_p))
    roofline = np.maximum(flops / hw.peak_flops_per_s, hbm / hw.hbm_bytes_per_s)
    return {"tiles": tiles, "old": old, "roofline": roofline}


def per_gemm(part: str) -> pd.DataFrame:
    """One part's table with the tile model's prediction and chosen kernel for every GEMM:
    columns M, K, N, time_s, tiles_s, error_percent (signed), tile, split."""
    rows, hw = load_part(part), HARDWARE[part]
    kernels = tile_kernels(rows, hw, default_params(hw))
    predicted = np.array([float(k.time_s) for k in kernels])
    return rows.assign(
        tiles_s=predicted,
        error_percent=(predicted / rows["time_s"].to_numpy(float) - 1.0) * 100.0,
        tile=[k.tile[0] for k in kernels],
        split=[int(k.split) for k in kernels],
    )


def _stats(predicted: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    error = predicted / measured - 1.0
    ape = np.abs(error) * 100.0
    return {
        "median": round(float(np.median(ape)), 2),
        "p90": round(float(np.percentile(ape, 90)), 2),
        "signed_median": round(float(np.median(error)) * 100.0, 2),
        "n": int(len(ape)),
    }


def split_half(rows: pd.DataFrame, half: str) -> pd.DataFrame:
    """The "dev" or "test" half of a table's GEMMs (shuffled with seed 0), on which modelling
    choices made while looking at these tables are chosen and then reported."""
    order = np.random.default_rng(0).permutation(len(rows))
    picked = {"dev": order[: len(rows) // 2], "test": order[len(rows) // 2 :]}[half]
    return rows.iloc[np.sort(picked)].reset_index(drop=True)


def transfer_errors(
    gemm: GemmParams | None = None, parts: tuple[str, ...] = TRANSFER_PARTS, half: str | None = None
) -> dict[str, Any]:
    """Per part and model: APE stats over every GEMM ("all"), over those above 10 us ("kernel") and
    over those above 20 us ("long").

    The models are the simulator's own for each part (`default_params`: the A100 calibration
    carried to it); `gemm` replaces the tile parameters (to try a variant); `half` ("dev" or
    "test") scores one half of each table only (`split_half`)."""
    report: dict[str, Any] = {}
    for part in parts:
        rows, hw = load_part(part), HARDWARE[part]
        if half is not None:
            rows = split_half(rows, half)
        params = default_params(hw) if gemm is None else dataclasses.replace(default_params(hw), gemm=gemm)
        measured = rows["time_s"].to_numpy(float)
        kernel, long = measured > KERNEL_MIN_S, measured > LONG_KERNEL_MIN_S
        report[part] = {
            model: {
                "all": _stats(pred, measured),
                "kernel": _stats(pred[kernel], measured[kernel]),
                "long": _stats(pred[long], measured[long]),
            }
            for model, pred in predictions(rows, hw, params).items()
        }
    return report


def transfer_keys(report: dict[str, Any]) -> dict[str, float]:
    """Flat figures of `transfer_errors` for a bench's last line: the tile model's and the old
    model's median and p90 APE per part over the GEMMs above 10 us, e.g.
    `h100_sxm_tiles_median_ape_percent`, and the same over the GEMMs above 20 us, e.g.
    `h100_sxm_tiles_above_20us_median_ape_percent`."""
    keys = {}
    for part, models in report.items():
        for name in ("tiles", "old"):
            for band, infix in (("kernel", ""), ("long", "above_20us_")):
                for stat in ("median", "p90"):
                    keys[f"{part.replace('-', '_')}_{name}_{infix}{stat}_ape_percent"] = models[name][band][stat]
    return keys


def calibration_keys(parts: tuple[str, ...] = TRANSFER_PARTS) -> dict[str, float]:
    """Each table used the other way: the tile model calibrated on the part's own GEMMs
    (`simulator.gemm_calibration.calibrate`, two-fold over seeded halves of its (K, N) shapes),
    its held-out median and p90 APE over every GEMM beside the carried A100 fit's on the same rows,
    e.g. `h100_sxm_calibrated_heldout_median_ape_percent` (about 20 s per part)."""
    from simulator.gemm_calibration import calibrate

    keys = {}
    for part in parts:
        held = calibrate(gemm_table(part), HARDWARE[part]).heldout
        name = part.replace("-", "_")
        for which, label in (("fitted", "calibrated"), ("carried", "carried")):
            for stat in ("median", "p90"):
                keys[f"{name}_{label}_heldout_{stat}_ape_percent"] = held[which][stat]
    return keys
