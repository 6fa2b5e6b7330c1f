"""The GEMM cost model on parts it was never fitted on: XLA's measured H100 and B200 tables are
shipped whole, and the tile model beats the old per-family model and a datasheet roofline there."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from simulator.gemm_transfer import (
    KERNEL_MIN_S,
    XLA_DIR,
    XLA_PARTS,
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


def test_tile_model_beats_the_old_model_and_the_roofline_on_unfitted_parts() -> None:
    report = transfer_errors()
    for part, models in report.items():
        tiles, old, roofline = (models[name]["kernel"] for name in ("tiles", "old", "roofline"))
        assert tiles["n"] == old["n"] >= 40, part
        assert tiles["median"] < old["median"] and tiles["median"] < roofline["median"], (part, models)
        assert np.isfinite([tiles["p90"], tiles["signed_median"]]).all()
    keys = transfer_keys(report)
    assert keys["h100_sxm_tiles_median_ape_percent"] == report["h100-sxm"]["tiles"]["kernel"]["median"]
    assert set(keys) == {
        f"{p}_{m}_{s}_ape_percent" for p in ("h100_sxm", "b200") for m in ("tiles", "old") for s in ("median", "p90")
    }


def test_per_gemm_rows_agree_with_the_summary() -> None:
    report = transfer_errors(parts=("b200",))
    table = per_gemm("b200")
    assert len(table) == 125 and table["tile"].str.contains("2sm").any()
    kernel = table[table["time_s"] > KERNEL_MIN_S]
    assert round(float(kernel["error_percent"].abs().median()), 2) == report["b200"]["tiles"]["kernel"]["median"]
