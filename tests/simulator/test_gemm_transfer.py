"""The GEMM cost model on parts it was never fitted on: XLA's measured H100 and B200 tables and the
project's H200 grid are shipped whole, and the tile model beats the old per-family model and a
datasheet roofline there."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from simulator.gemm_transfer import (
    KERNEL_MIN_S,
    LONG_KERNEL_MIN_S,
    MEASURED_DIR,
    MEASURED_PARTS,
    TRANSFER_PARTS,
    XLA_DIR,
    XLA_PARTS,
    load_part,
    load_xla,
    per_gemm,
    transfer_errors,
    transfer_keys,
)

SIZES = (256, 512, 1024, 2048, 4096)


@pytest.mark.parametrize("part", sorted(XLA_PARTS))
def test_tables_hold_the_whole_grid(part: str) -> None:
    raw = pd.read_csv(XLA_DIR / XLA_PARTS[part])
    assert sorted(map(tuple, raw[["m", "n", "k"]].to_numpy())) == sorted(itertools.product(SIZES, SIZES, SIZES))
    rows = load_xla(part)
    assert (rows["time_s"] > 0).all() and len(rows) == 125
    flops = 2 * rows["M"] * rows["N"] * rows["K"] / rows["time_s"]
    np.testing.assert_allclose(flops, raw["bf16_flops_per_s"], rtol=1e-12)
    assert (XLA_DIR / "README.md").exists() and (XLA_DIR / "LICENSE").exists()


def test_the_h200_grid_is_the_gpu_runs_measurement() -> None:
    """The project's H200 tables: bench/gemm_profile.py's default grid (16 (K, N) shapes x 10 token
    counts) and the same shapes at 22 token counts between, bf16, kernel time from CUDA graphs."""
    grid, between = (pd.read_csv(MEASURED_DIR / name) for name in MEASURED_PARTS["h200"])
    shapes = set(zip(grid["k"], grid["n"]))
    assert len(grid) == 160 and len(shapes) == 16 and set(zip(between["k"], between["n"])) == shapes
    assert len(between) == 352 and not set(grid["m"]) & set(between["m"])
    for table in (grid, between):
        assert set(table["timer"]) == {"graph"} and set(table["dtype"]) == {"bfloat16"}
        assert set(table["device"]) == {"NVIDIA H200"}
    rows = load_part("h200")
    assert list(rows.columns) == ["M", "K", "N", "time_s"] and len(rows) == 512
    np.testing.assert_allclose(rows["time_s"], pd.concat([grid, between])["time_s"], rtol=1e-12)
    assert (MEASURED_DIR / "README.md").exists()
    assert TRANSFER_PARTS == ("h100-sxm", "b200", "h200")


def test_tile_model_beats_the_old_model_and_the_roofline_on_unfitted_parts() -> None:
    report = transfer_errors()
    for part, models in report.items():
        tiles, old, roofline = (models[name]["kernel"] for name in ("tiles", "old", "roofline"))
        assert tiles["n"] == old["n"] >= 40, part
        assert tiles["median"] < old["median"] and tiles["median"] < roofline["median"], (part, models)
        assert np.isfinite([tiles["p90"], tiles["signed_median"]]).all()
    keys = transfer_keys(report)
    assert keys["h100_sxm_tiles_median_ape_percent"] == report["h100-sxm"]["tiles"]["kernel"]["median"]
    assert keys["h200_old_above_20us_p90_ape_percent"] == report["h200"]["old"]["long"]["p90"]
    assert set(keys) == {
        f"{p}_{m}_{band}{s}_ape_percent"
        for p in ("h100_sxm", "b200", "h200")
        for m in ("tiles", "old")
        for band in ("", "above_20us_")
        for s in ("median", "p90")
    }
    for part, models in report.items():  # the bands nest: every GEMM, above 10 us, above 20 us
        counts = [models["tiles"][band]["n"] for band in ("all", "kernel", "long")]
        assert counts[0] > counts[1] > counts[2] > 0, (part, counts)


def test_per_gemm_rows_agree_with_the_summary() -> None:
    report = transfer_errors(parts=("b200",))
    table = per_gemm("b200")
    assert len(table) == 125 and table["tile"].str.contains("2sm").any()
    kernel = table[table["time_s"] > KERNEL_MIN_S]
    assert round(float(kernel["error_percent"].abs().median()), 2) == report["b200"]["tiles"]["kernel"]["median"]
    long = table[table["time_s"] > LONG_KERNEL_MIN_S]
    assert round(float(long["error_percent"].abs().median()), 2) == report["b200"]["tiles"]["long"]["median"]
