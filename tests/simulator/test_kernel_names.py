"""The tile a GEMM library ran, read from its kernel's name (simulator/kernel_names.py), and the
tile model's pick set against it (bench/cost_model.py --kernels)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from simulator.hardware import get_hardware
from simulator.kernel_names import LibraryTile, library_tile, library_vs_model, model_tile

ROOT = Path(__file__).resolve().parents[2]
NVJET = "nvjet_sm90_tst_64x8_64x16_2x1_v_bz_TNT"  # seen on the H200: an 8B decode pass's GEMMs
XMMA = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel"


@pytest.mark.parametrize(
    ("kernels", "tile"),
    [
        (NVJET, LibraryTile(8, 64, False)),
        ("nvjet_sm90_tst_128x8_64x12_2x1_v_bz_splitK_TNT", LibraryTile(8, 128, True)),
        (f"{NVJET}+void cublasLt::splitKreduce_kernel<32, 16, int, float>", LibraryTile(8, 64, True)),
        (XMMA, LibraryTile(256, 128, False)),
        ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x3_tn", LibraryTile(64, 128, False)),
        ("cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x256_64x4_tn_align8", LibraryTile(256, 64, False)),
        ("Memset (Device)+" + XMMA, LibraryTile(256, 128, False)),  # the first GEMM kernel among them
    ],
)
def test_a_kernel_name_gives_its_tile_along_tokens_and_n(kernels, tile):
    """The library's first tile dimension runs along N (PyTorch's row-major product is the
    column-major C^T), its second along the tokens; split-K from the name or a reduction kernel."""
    assert library_tile(kernels) == tile


@pytest.mark.parametrize("kernels", ["aten::mm", "", "Memset (Device)", "gemv2T_kernel_val<int, int, 128>", "nan"])
def test_a_name_without_a_tile_gives_none(kernels):
    assert library_tile(kernels) is None


def test_model_tile_reads_the_tile_models_labels():
    assert model_tile("64x128x64c2") == (64, 128) and model_tile("256x128x64/2sm") == (256, 128)
    assert model_tile("128x256x32") == (128, 256) and LibraryTile(8, 64, True).label == "8x64 split-K"


def _table() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "M": [1, 1, 4096, 512],
            "K": [4096, 4096, 4096, 4096],
            "N": [4096, 14336, 4096, 14336],
            "time_s": [12e-6, 30e-6, 200e-6, 130e-6],
            "kernels": [NVJET, NVJET, XMMA, "Memset (Device)"],
        }
    )


def test_library_vs_model_counts_agreement_per_token_count():
    """Rows with a named tile only; per token count the library's and the model's most common
    tiles and their agreement; the model's error where they agree and where they do not."""
    from simulator.cost import default_params
    from simulator.gemm import gemm_kernel

    hw = get_hardware("h200")
    report = library_vs_model(_table(), hw)
    assert report["gemms"] == 4 and report["named"] == 3
    assert [t["tokens"] for t in report["per_tokens"]] == [1, 4096]
    one, big = report["per_tokens"]
    assert one["gemms"] == 2 and one["library"] == "8x64" and one["library_split_share"] == 0.0
    picks = [
        model_tile(gemm_kernel(m, 4096.0, n, hw, default_params(hw).gemm).tile[0])
        for m, n in ((1.0, 4096.0), (4096.0, 4096.0))
    ]
    assert one["model"] == "{}x{}".format(*picks[0]) and big["model"] == "{}x{}".format(*picks[1])
    assert big["library"] == "256x128" and big["agree_share"] == float(picks[1] == (256, 128))
    splits = [
        gemm_kernel(m, 4096.0, n, hw, default_params(hw).gemm).split > 1 for m, n in ((1.0, 4096.0), (1.0, 14336.0))
    ]
    assert one["model_split_share"] == sum(splits) / 2 and big["library_split_share"] == 0.0
    assert 0 <= report["agree_share"] <= 1


def test_bench_cost_model_kernels_prints_the_comparison_and_refuses_a_table_without_names(tmp_path):
    table = _table().rename(columns={"M": "m", "K": "k", "N": "n"})
    table.to_csv(tmp_path / "named.csv", index=False)
    run = [sys.executable, str(ROOT / "bench" / "cost_model.py"), "--kernels"]
    r = subprocess.run(
        [*run, str(tmp_path / "named.csv"), "--hardware", "h200"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    figures = json.loads(r.stdout.strip().splitlines()[-1])
    assert figures["bench"] == "cost_model_kernels" and figures["named"] == 3
    assert "library      8x64" in r.stdout
    table.drop(columns="kernels").to_csv(tmp_path / "plain.csv", index=False)
    r = subprocess.run(
        [*run, str(tmp_path / "plain.csv"), "--hardware", "h200"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].endswith("missing kernels")
    r = subprocess.run([*run, str(tmp_path / "named.csv")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--kernels TABLE goes with --hardware PART alone" in r.stderr
