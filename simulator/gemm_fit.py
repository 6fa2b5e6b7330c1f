"""Fit the tile-and-wave GEMM model (`simulator.gemm`) to the vidur A100 data, and judge it on
shapes it never saw.

What: `gemm_rows` turns the vidur per-op table (`simulator.calibrate.load_vidur`) into one row
per GEMM measurement with its (M, K, N); `fit_gemm` fits seven `GemmParams` numbers (tensor and
HBM efficiency inside a tile, pipeline fill, launch overhead, overlap, kernel-choice spread,
share of the last wave recovered; the L2 feed comes from the A100 whitepaper) by least squares
on log(predicted / measured);
`holdout_predictions` and `summary` fit on some shapes and report the error on held-out ones:
leave one model out and leave one tensor-parallel degree out, pooled over rows whose (K, N)
shape never occurs in the fold's fit set, with the old per-family roofline
(`simulator.cost.OpEfficiency`, fitted on the same rows) beside it.

Why: the tile parameters must describe a tile, not an op or a part, so that one A100 fit serves
every NVIDIA part (docs/cost_model.md); error on unseen shapes is the honest test of that.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from simulator.cost import OP_FAMILY, gemm_shapes
from simulator.gemm import GemmParams, gemm_kernel
from simulator.hardware import HARDWARE, HardwareSpec

A100 = HARDWARE["a100-80g"]
VIDUR_GEMM_OPS: tuple[str, ...] = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
# Fitted parameters, their bounds and starting point (GemmParams field order). choice_q >= 10:
# lower, the power mean over tile shapes drifts towards their harmonic mean (q = 1: a random
# tile), so the time depends on how many tiles a family's table lists and how far apart their
# speeds are (on Hopper and Blackwell the small tiles are L2-bound: at q = 5 the mean costs an
# H100 10% at 4096 tokens), a count, not physics. On a dev split of the A100 shapes (seeded
# halves; bench/cost_model.py --dev --min choice_q=Q) the bound hardly matters: median/p90 APE
# 4.43/11.51 free (q wandered from 0.5 to 6, tensor_eff from 0.81 to 0.92), 4.43/11.53 at q >= 5,
# 4.45/11.52 at >= 10, 4.46/11.56 at >= 15.
FIT_FIELDS: tuple[str, ...] = (
    "tensor_eff",
    "fill_iters",
    "feed_bytes_per_clock",
    "memory_eff",
    "launch_overheads",
    "overlap_p",
    "choice_q",
    "tail_share",
)
_LOWER = np.array([0.3, 0.0, 8.0, 0.3, 0.05, 1.0, 10.0, 0.0])
_UPPER = np.array([1.0, 20.0, 256.0, 1.0, 10.0, 20.0, 100.0, 1.0])
_START = np.array([0.8, 2.0, 48.0, 0.9, 1.0, 2.0, 12.0, 0.3])
# Not fitted: the L2 -> SM operand feed, from the A100 whitepaper's L2 read bandwidth of 5,120
# bytes per clock over its 108 SMs (assumed the same bytes per SM-clock on every part).
FIXED_FROM_DATASHEETS: dict[str, float] = {"feed_bytes_per_clock": 5120 / 108}
TOKEN_BINS: tuple[int, ...] = (0, 16, 64, 256, 1024, 4096, 1 << 20)


def gemm_rows(table: pd.DataFrame) -> pd.DataFrame:
    """GEMM rows of a `load_vidur` table with columns K and N of the shard's GEMM."""
    from simulator.calibrate import _spec_of

    rows = table[table["op"].isin(VIDUR_GEMM_OPS)].copy()
    k_col, n_col = np.empty(len(rows)), np.empty(len(rows))
    for (_model, tp), group in rows.groupby(["model", "tp"], sort=False):
        shapes = gemm_shapes(_spec_of(group.iloc[0]), int(tp))
        idx = rows.index.get_indexer(group.index)
        k_col[idx] = [shapes[op][0] for op in group["op"]]
        n_col[idx] = [shapes[op][1] for op in group["op"]]
    rows["K"], rows["N"] = k_col, n_col
    return rows.reset_index(drop=True)


def predict_tiles(rows: pd.DataFrame, params: GemmParams, hardware: HardwareSpec = A100) -> np.ndarray:
    """Seconds the tile model predicts for every row (one vectorised call per (K, N) shape)."""
    out = np.empty(len(rows))
    for (k, n), group in rows.groupby(["K", "N"], sort=False):
        idx = rows.index.get_indexer(group.index)
        out[idx] = gemm_kernel(group["num_tokens"].to_numpy(float), k, n, hardware, params).time_s
    return out


def predict_old(rows: pd.DataFrame, families: dict[str, Any], hardware: HardwareSpec = A100) -> np.ndarray:
    """Seconds the old per-family roofline predicts for every row."""
    from simulator.calibrate import _predict, _work_arrays

    out = np.empty(len(rows))
    for family, group in rows.groupby("family", sort=False):
        idx = rows.index.get_indexer(group.index)
        x = np.array(dataclasses.astuple(families[str(family)]))
        out[idx] = _predict(x, _work_arrays(group), hardware, 4.0)
    return out


def fit_gemm(
    rows: pd.DataFrame,
    hardware: HardwareSpec = A100,
    thin: int = 1,
    fixed: dict[str, float] | None = None,
    f_scale: float = 0.05,
    lower: dict[str, float] | None = None,
) -> GemmParams:
    """Least-squares fit of the tile parameters to measured GEMM rows (every `thin`-th token
    count of each shape, to bound the time); `fixed` holds fields not fitted, `lower` other
    lower bounds than `_LOWER` (the start moves up to a raised bound)."""
    if thin > 1:  # the vidur profiles: every thin-th token count of each (model, TP, op) profile
        rows = rows[rows.groupby(["model", "tp", "op"]).cumcount() % thin == 0]
    rows = rows.reset_index(drop=True)
    measured = rows["time_s"].to_numpy(float)
    fixed = dict(fixed or {})
    free = [i for i, name in enumerate(FIT_FIELDS) if name not in fixed]
    low = np.array([dict(lower or {}).get(name, _LOWER[i]) for i, name in enumerate(FIT_FIELDS)])
    start = np.maximum(_START, low)

    def params_of(x: np.ndarray) -> GemmParams:
        values = dict(fixed)
        values.update({FIT_FIELDS[i]: float(v) for i, v in zip(free, x)})
        return GemmParams(**values)

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.log(predict_tiles(rows, params_of(x), hardware) / measured)

    # Soft-L1: a few kernels the library picks badly (a 40% jump from one token count to the
    # next) should not pull the tile parameters.
    result = least_squares(
        residuals,
        start[free],
        bounds=(low[free], _UPPER[free]),
        x_scale=start[free],
        diff_step=1e-2,
        loss="soft_l1",
        f_scale=f_scale,
        method="trf",
    )
    return params_of(result.x)


def shape_half(rows: pd.DataFrame, seed: int) -> np.ndarray:
    """Rows (a mask) of one half of the distinct (K, N) shapes, shuffled with `seed`: whole shapes
    held out, so the other half's fit never sees them."""
    shapes = sorted(set(zip(rows["K"], rows["N"])))
    order = list(shapes)
    np.random.default_rng(seed).shuffle(order)
    half = set(order[::2])
    return np.array([(k, n) in half for k, n in zip(rows["K"], rows["N"])])


def dev_split_predictions(
    rows: pd.DataFrame,
    seeds: tuple[int, ...] = (0, 1),
    thin: int = 8,
    fixed: dict[str, float] | None = None,
    lower: dict[str, float] | None = None,
) -> pd.DataFrame:
    """The dev split on which modelling choices are made (not the bench's folds): per seed, the
    (K, N) shapes shuffled and halved; fit on one half (every `thin`-th token count), predict
    the other, then the reverse. The GEMM rows of every test half with a `tiles_s` column;
    `.attrs["params"]` lists the fitted parameters in the same order."""
    frames, fitted = [], []
    for seed in seeds:
        in_half = shape_half(rows, seed)
        for train_mask in (in_half, ~in_half):
            train, test = rows[train_mask].reset_index(drop=True), rows[~train_mask].reset_index(drop=True)
            params = fit_gemm(train, thin=thin, fixed={**FIXED_FROM_DATASHEETS, **(fixed or {})}, lower=lower)
            frames.append(test.assign(seed=seed, tiles_s=predict_tiles(test, params)))
            fitted.append(params)
    held = pd.concat(frames, ignore_index=True)
    held.attrs["params"] = fitted
    return held


def _folds(rows: pd.DataFrame, split: str) -> Iterator[tuple[str, pd.Series]]:
    """(name, held-out mask) per fold: one model, or one tensor-parallel degree, held out."""
    column = {"model": "model", "tp": "tp"}[split]
    for value in sorted(rows[column].unique()):
        yield f"{split}={value}", rows[column] == value


def holdout_predictions(table: pd.DataFrame, thin: int = 1) -> pd.DataFrame:
    """Held-out GEMM rows of every fold with both models' predictions.

    Columns added: fold, split, unseen (the row's (K, N) is absent from the fold's fit set),
    tiles_s, old_s. Each fold refits both models on its training rows.
    """
    from simulator.calibrate import fit_family

    rows = gemm_rows(table)
    frames = []
    for split in ("model", "tp"):
        for name, held in _folds(rows, split):
            train, test = rows[~held].reset_index(drop=True), rows[held].reset_index(drop=True)
            params = fit_gemm(train, thin=thin, fixed=FIXED_FROM_DATASHEETS)
            families = {family: fit_family(group) for family, group in train.groupby("family")}
            seen = set(zip(train["K"], train["N"]))
            test = test.assign(
                fold=name,
                split=split,
                unseen=[(k, n) not in seen for k, n in zip(test["K"], test["N"])],
                tiles_s=predict_tiles(test, params),
                old_s=predict_old(test, families),
            )
            frames.append(test)
    return pd.concat(frames, ignore_index=True)


def ape_percent(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    return np.abs(np.asarray(predicted) / np.asarray(measured) - 1.0) * 100.0


def level_removed_ape(held: pd.DataFrame, keys: list[str]) -> tuple[float, float]:
    """Median and p90 APE of `tiles_s` against `time_s` once each group's (rows equal on `keys`)
    median log error is taken out: how much of the error a level per group could remove, and how
    much is left as the group's own shape (steps placed elsewhere than the data's)."""
    log_error = pd.Series(np.log(held["tiles_s"].to_numpy(float) / held["time_s"].to_numpy(float)), index=held.index)
    level = log_error.groupby([held[key] for key in keys], observed=True).transform("median")
    ape = ape_percent(np.exp((log_error - level).to_numpy()), np.ones(len(held)))
    return float(np.median(ape)), float(np.percentile(ape, 90))


def repeat_spread_percent(rows: pd.DataFrame) -> tuple[float, float, int]:
    """The measurement's own spread: each GEMM (K, N and token count) timed in more than one
    (model, TP) profile, as max / min - 1 of its times in percent (in the vidur data Llama-2-7B
    and Llama-3-8B share their output projections at every TP degree and one QKV shape). Median,
    p90 and how many such GEMMs: no model can be held to much less error than two timings of one
    GEMM disagree by."""
    keys = ["K", "N", "num_tokens"]
    profiles = (rows["model"].astype(str) + "/" + rows["tp"].astype(str)).groupby([rows[k] for k in keys]).nunique()
    times = rows.groupby(keys)["time_s"]
    spread = ((times.max() / times.min() - 1.0) * 100.0)[profiles > 1]
    if spread.empty:
        return float("nan"), float("nan"), 0
    return float(np.median(spread)), float(np.percentile(spread, 90)), len(spread)


def profile_levels(rows: pd.DataFrame, above: int = 1024) -> list[tuple[str, str, int, float, float]]:
    """How much two models' profiles disagree on the very same GEMMs (K, N and token count), as
    a level: per pair of models that share GEMMs, (model a, model b, shared GEMMs, median of a's
    time over b's in percent less 100, the same above `above` tokens; NaN where none is). A
    leave-one-model-out fold meets its profile's own level, which no model of the shape can learn.
    Each model's time of a GEMM is its median over that model's profiles (TP degrees)."""
    keys = ["K", "N", "num_tokens"]
    times = rows.pivot_table(index=keys, columns="model", values="time_s", aggfunc="median", observed=True)
    models = sorted(str(m) for m in times.columns)
    levels = []
    for i, a in enumerate(models):
        for b in models[i + 1 :]:
            ratio = (times[a] / times[b]).dropna()
            if ratio.empty:
                continue
            big = ratio[ratio.index.get_level_values("num_tokens") > above]
            level_big = float(np.exp(np.median(np.log(big))) - 1.0) * 100.0 if len(big) else float("nan")
            levels.append((a, b, len(ratio), float(np.exp(np.median(np.log(ratio))) - 1.0) * 100.0, level_big))
    return levels


def unseen_keys(report: dict[str, Any]) -> dict[str, float]:
    """The issue's target keys from `summary`: pooled unseen-shape APE of the tile model, the old
    model's beside it (bench/cost_model.py and bench/simulator.py print them)."""
    return {
        "a100_unseen_median_ape_percent": round(report["tiles"]["median"], 2),
        "a100_unseen_p90_ape_percent": round(report["tiles"]["p90"], 2),
        "old_model_unseen_median_ape_percent": round(report["old"]["median"], 2),
        "old_model_unseen_p90_ape_percent": round(report["old"]["p90"], 2),
    }


def summary(held: pd.DataFrame) -> dict[str, Any]:
    """Median and p90 APE of both models: pooled over unseen rows, per op family, per token
    count band, per fold."""
    unseen = held[held["unseen"]]
    tiles, old = (ape_percent(unseen[c], unseen["time_s"]) for c in ("tiles_s", "old_s"))

    def stats(values: np.ndarray) -> dict[str, float]:
        return {"median": float(np.median(values)), "p90": float(np.percentile(values, 90)), "n": len(values)}

    def by(column: pd.Series) -> dict[str, dict[str, dict[str, float]]]:
        return {
            str(key): {"tiles": stats(tiles[mask]), "old": stats(old[mask])}
            for key, mask in ((k, (column == k).to_numpy()) for k in column.unique())
        }

    bands = pd.cut(unseen["num_tokens"], TOKEN_BINS, right=True).astype(str)
    return {
        "rows": len(held),
        "unseen_rows": len(unseen),
        "tiles": stats(tiles),
        "old": stats(old),
        "by_family": by(unseen["op"].map(OP_FAMILY)),
        "by_tokens": by(bands),
        "by_fold": by(unseen["fold"]),
    }
