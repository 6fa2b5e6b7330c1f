"""The tile a GEMM library ran, read from its kernel's name (`bench/gemm_profile.py --kernels`).

What: `library_tile(name)` reads the output tile of a cuBLAS or CUTLASS GEMM kernel from the name
the profiler gives it, in the simulator's orientation: (rows along the tokens, columns along N)
of an (M tokens x K) @ (K x N) product, and whether it splits K. Names it reads:

    nvjet_sm90_tst_64x8_64x16_2x1_v_bz_splitK_TNT                 cuBLAS 12.x/13 on Hopper (nvjet)
    sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_... cuBLAS's xmma kernels
    ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x3_tn      cuBLAS on Ampere
    cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8   CUTLASS

PyTorch's row-major `a @ b` calls the column-major library for C^T = B^T A^T, so the library's
first tile dimension runs along N and its second along the tokens: a decode GEMM's
`nvjet_..._tst_64x8_...` is an 8-token by 64-column tile. A name it cannot read gives None (a
GEMV, a reduction kernel, a CPU operator).

Why: the A100 residuals come down to which kernel cuBLAS picks per shape and token band
(docs/cost_model.md); a part's own table with kernel names says which, so the tile model's pick
can be checked against it (`python bench/cost_model.py --kernels TABLE --hardware PART`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NVJET = re.compile(r"nvjet_sm\d+_t\w\w_(\d+)x(\d+)_")
_TILESIZE = re.compile(r"tilesize(\d+)x(\d+)x\d+")
_SIZE_STAGES = re.compile(r"gemm\w*?_(\d+)x(\d+)_(?:ldg\d+_)?\w*?(?:stages_)?\d+x\d+")


@dataclass(frozen=True)
class LibraryTile:
    tokens: int  # the tile's rows along the tokens (M)
    cols: int  # ... and along N
    split_k: bool  # the kernel splits K (its name says so, or a reduction kernel follows it)

    @property
    def label(self) -> str:
        return f"{self.tokens}x{self.cols}" + (" split-K" if self.split_k else "")


def library_tile(kernels: str) -> LibraryTile | None:
    """The output tile of the first GEMM kernel among `kernels` ("+"-joined names, as
    `bench/gemm_profile.py --kernels` records them), in (tokens, N) orientation; None when no
    name is one of the forms above."""
    names = [n for n in str(kernels).split("+") if n]
    split = any("splitk" in n.lower() for n in names)
    for name in names:
        for pattern in (_NVJET, _TILESIZE, _SIZE_STAGES):
            m = pattern.search(name)
            if m:
                along_n, along_tokens = int(m.group(1)), int(m.group(2))
                return LibraryTile(tokens=along_tokens, cols=along_n, split_k=split)
    return None


def model_tile(label: str) -> tuple[int, int]:
    """(rows along the tokens, columns along N) of the tile model's kernel label, e.g.
    "64x128x64c2" (tm x tn x tk, a 2-CTA cluster) or "256x128x64/2sm"."""
    tm, tn = label.split("x")[:2]
    return int(tm), int(tn)


def library_vs_model(table, hardware) -> dict:
    """Per GEMM of `table` (columns M, K, N, time_s, kernels; `hardware` a HardwareSpec): the
    library's tile read from its kernel names, the tile model's pick and prediction; per token
    count, the library's most common tile, the model's, how often each splits K, and how often
    the tiles agree; the model's median APE where its tile is the library's and where it is not.
    Rows whose kernels name no tile are counted and left out."""
    import numpy as np

    from simulator.cost import default_params
    from simulator.gemm_transfer import tile_kernels

    params = default_params(hardware)
    if params.gemm is None:
        raise ValueError(f"{hardware.name} has no GEMM tile model (a GPU part has)")
    tiles = [library_tile(k) for k in table["kernels"]]
    named = table[[t is not None for t in tiles]].reset_index(drop=True)
    rows = []
    for r, lib, k in zip(
        named.itertuples(), [t for t in tiles if t is not None], tile_kernels(named, hardware, params)
    ):
        tm, tn = model_tile(k.tile[0])
        rows.append(
            {
                "M": int(r.M),
                "library": f"{lib.tokens}x{lib.cols}",
                "library_split": lib.split_k,
                "model": f"{tm}x{tn}",
                "model_split": int(k.split) > 1,
                "agree": (lib.tokens, lib.cols) == (tm, tn),
                "ape": abs(float(k.time_s) / float(r.time_s) - 1.0) * 100.0,
            }
        )
    out: dict = {"gemms": int(len(table)), "named": len(rows), "per_tokens": []}
    if not rows:
        return out
    import pandas as pd

    df = pd.DataFrame(rows)
    for m, g in df.groupby("M"):
        out["per_tokens"].append(
            {
                "tokens": int(m),
                "gemms": int(len(g)),
                "library": g["library"].mode().iloc[0],
                "library_split_share": round(float(g["library_split"].mean()), 3),
                "model": g["model"].mode().iloc[0],
                "model_split_share": round(float(g["model_split"].mean()), 3),
                "agree_share": round(float(g["agree"].mean()), 3),
            }
        )
    out["agree_share"] = round(float(df["agree"].mean()), 3)
    for name, part in (("agree", df[df["agree"]]), ("disagree", df[~df["agree"]])):
        out[f"{name}_median_ape_percent"] = round(float(np.median(part["ape"])), 2) if len(part) else None
    return out
