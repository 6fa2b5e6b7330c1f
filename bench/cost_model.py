"""Cost-model benchmark: GEMM time error on A100 shapes never fitted, tile model vs old model.

What: the public vidur A100 profiles (simulator/data/vidur-a100: Llama-2-7B/70B, Llama-3-8B at
TP 1/2/4/8, Phi-2 at TP 1) hold ~16,500 GEMM timings (QKV, output projection, MLP up and down).
For each fold, leave one model out (4 folds) and leave one tensor-parallel degree out (4 folds),
both cost models are refitted on the remaining rows: the tile-and-wave GEMM model
(`simulator.gemm`, 7 fitted numbers shared by all GEMMs) and the old per-family roofline
(`OpEfficiency`, 4 numbers per op family). Errors are absolute percentage errors (APE) on held-out
rows whose (K, N) shape never occurs in the fold's fit set, pooled over all folds; per op family,
per token-count band and per fold beside them.

Why: the tile parameters must carry to shapes (and parts) they were not fitted on; error on
unseen shapes is the honest measure (issue 16). Goal on A100: median <= 4%, p90 <= 10%.

Unfiltered: every held-out row counts once per fold it is held out in (a row is held out twice:
once for its model, once for its TP degree). --quick fits on every 8th token count of each
profile (the full run on every 2nd); evaluation always covers every held-out row. After the
table: the error left once each unseen shape's (and each shape and token band's) median error is
taken out, and how far apart the data's own repeated timings of one GEMM are.

Last line: {"bench": "cost_model", "a100_unseen_median_ape_percent", "a100_unseen_p90_ape_percent",
"old_model_unseen_median_ape_percent", "old_model_unseen_p90_ape_percent", ...,
"shape_band_level_removed_p90_ape_percent", "a100_repeat_p90_percent", ...}.

`--dev` scores the tile model on the dev split on which its modelling choices were made (not the
folds above): the (K, N) shapes shuffled (seeds 0 and 1) and halved, fit on one half (every 8th
token count), score the other and the reverse; `--fix NAME=VALUE` and `--min NAME=VALUE` (either
repeated) fix a tile parameter or set its lower bound there, to compare variants. It also
prints the error left once each shape's (and each shape and token band's) median error is taken
out: what a level per shape could fix at best, against the steps within a shape; the data's
own spread, as the default run does; and the largest per-shape levels above 1024 tokens.

`--steps` prints where the measured profiles themselves step (no model): per (K, N) shape, the
time's change from 128 to 136 and from 192 to 200 tokens, and three profiles' times around their
steps, the data docs/cost_model.md quotes.

`--transfer` checks both models on parts they were never fitted on: the error on XLA's measured
bf16 GEMM tables for an H100 SXM and a B200 (simulator/data/xla-gemm, 125 GEMMs each) and on the
project's own H200 measurement (simulator/data/h200-gemm, 512 GEMMs of LLM projection shapes at
1-8192 tokens), with a datasheet roofline beside them, then what the two models predict for
Llama-3-8B's up projection at 1, 300 and 4096 tokens on every GPU of the catalog.
`--calibration` uses the same tables the other way: the tile model calibrated on each part's own GEMMs (`solm calibrate`),
scored on the (K, N) shapes its fit did not see, beside the carried A100 fit.

`--choice` asks how much of the error is the kernel choice (seconds): each tile shape's time per
A100 row, the shape closest to the measured time (an oracle, per row or per shape and token
band), and a learned preference per shape fitted on half of the dev split and scored on the other.

`--kernels TABLE --hardware PART` checks the tile model's pick against the library's on a part's
own table with kernel names (`bench/gemm_profile.py --kernels`; simulator/kernel_names.py reads
the tile from each name): per token count, the library's most common tile, the model's, and how
often they agree. No shipped table has names yet: the next GPU run's gemm step records them.

    .venv/bin/python bench/cost_model.py [--quick | --transfer [--half dev|test] | --calibration | --steps | --choice |
                                          --dev [--fix NAME=VALUE] [--min NAME=VALUE] | --kernels TABLE --hardware PART]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import dataclasses  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from simulator.calibrate import load_vidur  # noqa: E402
from simulator.cost import CostModel, gemm_shapes  # noqa: E402
from simulator.gemm_fit import (  # noqa: E402
    FIT_FIELDS,
    TOKEN_BINS,
    ape_percent,
    dev_split_predictions,
    gemm_rows,
    holdout_predictions,
    level_removed_ape,
    predict_tiles,
    profile_levels,
    repeat_spread_percent,
    summary,
    unseen_keys,
)
from simulator.gemm_transfer import (  # noqa: E402
    KERNEL_MIN_S,
    TRANSFER_PARTS,
    calibration_keys,
    per_gemm,
    transfer_errors,
    transfer_keys,
)
from simulator.hardware import HARDWARE  # noqa: E402
from simulator.models import get_model  # noqa: E402


def _row(name: str, entry: dict) -> str:
    tiles, old = entry["tiles"], entry["old"]
    return (
        f"  {name:26s} {tiles['n']:6d}  {tiles['median']:6.1f} {tiles['p90']:6.1f}"
        f"   {old['median']:6.1f} {old['p90']:6.1f}"
    )


def measured_transfer(half: str | None, worst: int = 3) -> dict:
    """Error of both models (and a datasheet roofline) on the measured H100, B200 and H200 GEMMs."""
    report = transfer_errors(half=half)
    print(
        "Measured GEMMs on parts never fitted (simulator/data/xla-gemm: XLA's bf16 tables, m, n, k in "
        "256..4096; simulator/data/h200-gemm: the project's H200 grid, 1-8192 tokens"
        f"{f'; the {half} half' if half else ''}): APE % median / p90 (signed median), every GEMM "
        "and those above 10 us and 20 us (XLA's tables carry a fixed cost of about 5 us)"
    )

    def stats(label: str, entry: dict) -> str:
        return (
            f"{label} ({entry['n']:3d}) {entry['median']:5.1f} / {entry['p90']:5.1f} ({entry['signed_median']:+5.1f})"
        )

    for part, models in report.items():
        for name, entry in models.items():
            print(
                f"  {part:9s} {name:9s} {stats('all', entry['all'])}   {stats('> 10 us', entry['kernel'])}"
                f"   {stats('> 20 us', entry['long'])}"
            )
    for part in report if half is None else ():  # the whole tables only
        table = per_gemm(part)
        table = table.assign(flops=2 * table["M"] * table["K"] * table["N"])
        largest = table.loc[table["flops"].idxmax()]
        print(
            f"  {part}: largest GEMM {largest.M:.0f} x {largest.N:.0f} x {largest.K:.0f} (m x n x k) measured "
            f"{largest.flops / largest.time_s / 1e12:.0f} TFLOP/s, tile model {largest.flops / largest.tiles_s / 1e12:.0f} "
            f"({largest.tile}, split {largest.split}); worst above 10 us:"
        )
        kernel = table[table["time_s"] > KERNEL_MIN_S]
        for row in kernel.loc[kernel["error_percent"].abs().nlargest(worst).index].itertuples():
            print(
                f"    {row.M:5.0f} x {row.N:5.0f} x {row.K:5.0f}  measured {row.time_s * 1e6:6.1f} us  "
                f"predicted {row.tiles_s * 1e6:6.1f} us ({row.error_percent:+5.1f}%)  {row.tile}, split {row.split}"
            )
        if table["M"].nunique() > 8:  # a table over token counts (the H200 grid): where the error sits
            ratio = (table["tiles_s"] / table["time_s"]).groupby(table["M"]).median()
            print(f"  {part}: median predicted / measured time per token count:")
            print("    " + "  ".join(f"{m:.0f}: {r:.2f}" for m, r in ratio.items()))
    return report


def transfer() -> dict:
    """Predicted achieved rate of the up projection (4096 x 28672 per token) per part."""
    model = get_model("llama-3-8b")
    k, n = gemm_shapes(model)["mlp_up_proj"]
    print(
        "Llama-3-8B mlp_up_proj (K 4096, N 28672): predicted achieved TFLOP/s (300 and 4096 "
        "tokens) and TB/s of weight streaming (1 token), tile model / old model"
    )
    rows = {}
    for name, hw in HARDWARE.items():
        if hw.kind != "gpu":
            continue
        tiles = CostModel(hw, model)
        old = CostModel(hw, model, dataclasses.replace(tiles.params, gemm=None))
        rates = []
        for cost in (tiles, old):
            times = {m: float(cost.op_times_s(m, m)["mlp_up_proj"]) for m in (1, 300, 4096)}
            rates.append(
                {
                    "tb_s_1": k * n * 2 / times[1] / 1e12,
                    "tflop_s_300": 2 * 300 * k * n / times[300] / 1e12,
                    "tflop_s_4096": 2 * 4096 * k * n / times[4096] / 1e12,
                }
            )
        rows[name] = {"tiles": rates[0], "old": rates[1]}
        print(
            f"  {name:10s} peak {hw.peak_flops_per_s / 1e12:7.1f}: 4096 tokens "
            f"{rates[0]['tflop_s_4096']:6.1f} / {rates[1]['tflop_s_4096']:6.1f}   300 tokens "
            f"{rates[0]['tflop_s_300']:6.1f} / {rates[1]['tflop_s_300']:6.1f}   1 token "
            f"{rates[0]['tb_s_1']:5.2f} / {rates[1]['tb_s_1']:5.2f} TB/s"
        )
    return rows


def _settings(parser: argparse.ArgumentParser, items: list[str]) -> dict[str, float]:
    """NAME=VALUE pairs of tile parameters (--fix, --min)."""
    out = {}
    for item in items:
        name, _, value = item.partition("=")
        try:
            out[name] = float(value)
        except ValueError:
            parser.error(f"{item!r}: expected NAME=NUMBER")
        if name not in FIT_FIELDS:
            parser.error(f"{name!r}: not a fitted tile parameter ({', '.join(FIT_FIELDS)})")
    return out


def where_the_error_is(held: pd.DataFrame, fit: str, rows: pd.DataFrame) -> dict[str, float]:
    """Print (and return) the error left once a level per shape, or per shape and token band, is
    taken out of the held-out rows (`fit`: the column naming the fit that predicted them; the model
    could at best remove a level, what is left is steps placed elsewhere than the data's), and the
    spread of the data's own repeated timings (`rows`: every GEMM row, `gemm_rows`)."""
    held = held.assign(band=pd.cut(held["num_tokens"], TOKEN_BINS).astype(str))
    figures = {}
    for label, key, keys in (
        ("shape", "shape_level_removed", [fit, "K", "N"]),
        ("shape and token band", "shape_band_level_removed", [fit, "K", "N", "band"]),
    ):
        median, p90 = level_removed_ape(held, keys)
        print(f"  left once each {label}'s median error is removed: median {median:.2f}  p90 {p90:.2f}")
        figures.update({f"{key}_median_ape_percent": round(median, 2), f"{key}_p90_ape_percent": round(p90, 2)})
    median, p90, count = repeat_spread_percent(rows)
    print(
        f"  the data's own spread: {count} GEMMs timed in more than one profile (same K, N and tokens) differ by "
        f"median {median:.2f}  p90 {p90:.2f} (max / min - 1, %)"
    )
    figures.update({"a100_repeat_median_percent": round(median, 2), "a100_repeat_p90_percent": round(p90, 2)})
    for a, b, count, level, level_big in profile_levels(rows):
        print(
            f"  the same {count} GEMMs in {a}'s and {b}'s profiles: {a}'s times differ by a median {level:+.2f}%, "
            f"{level_big:+.2f}% above 1024 tokens (a level of the profile, not of the shape)"
        )
    return figures


def shape_levels(held: pd.DataFrame, above: int = 1024, most: int = 5) -> None:
    """Print the held-out shapes' signed median error above `above` tokens (positive: the model is
    slow), the `most` largest each way: the per-shape level a tile model cannot learn."""
    log_error = np.log(held["tiles_s"].to_numpy(float) / held["time_s"].to_numpy(float))
    big = held.assign(error=(np.exp(log_error) - 1.0) * 100.0)[held["num_tokens"] > above]
    level = big.groupby(["K", "N"])["error"].median().sort_values()
    for label, part in (("model fast", level.head(most)), ("model slow", level.tail(most)[::-1])):
        shapes = ", ".join(f"{int(k)}x{int(n)} {e:+.1f}" for (k, n), e in part.items())
        print(f"  per-shape level above {above} tokens, {label} (K x N, signed median %): {shapes}")


def dev(fixed: dict[str, float], lower: dict[str, float]) -> dict:
    """Median and p90 APE of the tile model on the dev split, pooled and per token band."""
    start = time.perf_counter()
    rows = gemm_rows(load_vidur())
    held = dev_split_predictions(rows, fixed=fixed, lower=lower)
    ape = pd.Series(ape_percent(held["tiles_s"], held["time_s"]), index=held.index)
    bands = ape.groupby(pd.cut(held["num_tokens"], TOKEN_BINS), observed=True)
    print(
        f"dev split (shape halves, seeds 0 and 1; fixed {fixed or 'none'}, lower bounds {lower or 'default'}): "
        f"{len(held)} rows, {time.perf_counter() - start:.0f} s"
    )
    print(f"  all: median {np.median(ape):.2f}  p90 {np.percentile(ape, 90):.2f}")
    for band, values in bands:
        print(f"  {str(band):18s} median {np.median(values):5.2f}  p90 {np.percentile(values, 90):5.2f}")
    where_the_error_is(held, "seed", rows)
    shape_levels(held)
    for params in held.attrs["params"]:
        print("  fitted:", ", ".join(f"{name} {getattr(params, name):.3g}" for name in FIT_FIELDS))
    return {
        "bench": "cost_model_dev",
        "fixed": fixed,
        "lower": lower,
        "dev_median_ape_percent": round(float(np.median(ape)), 2),
        "dev_p90_ape_percent": round(float(np.percentile(ape, 90)), 2),
    }


# The step pairs and example profiles docs/cost_model.md quotes ("Where the steps are"): each
# profile's times at token counts (lo, lo) or over spans (lo, hi) around its steps.
STEP_PAIRS: tuple[tuple[int, int], ...] = ((128, 136), (192, 200))
STEP_SERIES: tuple[tuple[str, int, str, tuple[tuple[int, int], ...]], ...] = (
    (
        "Llama-2-70b-hf",
        2,
        "attn_post_proj",
        ((192, 192), (200, 200), (384, 384), (392, 392), (136, 192), (200, 256), (264, 384)),
    ),
    ("Meta-Llama-3-8B", 1, "attn_pre_proj", ((256, 256), (320, 320), (512, 512), (528, 528))),
    ("Llama-2-7b-hf", 1, "mlp_down_proj", ((128, 128), (136, 176), (184, 192))),  # a rare non-monotone pick
)


def steps() -> dict:
    """`--steps`: where the measured profiles step, per (K, N) shape (no model involved): the time's
    change across each of STEP_PAIRS (median over the profiles timing the shape), and three
    profiles' times at token counts around their steps."""
    rows = gemm_rows(load_vidur())
    table = rows.groupby(["K", "N", "num_tokens"])["time_s"].median().unstack()
    needed = [m for pair in STEP_PAIRS for m in pair]
    table = table.dropna(subset=needed)
    print("Measured time change across token counts, vidur A100 profiles (median over profiles timing a shape), %:")
    print(f"  {'K':>6s} {'N':>6s}  " + "  ".join(f"{f'{a}->{b}':>9s}" for a, b in STEP_PAIRS))
    jumps = {}
    for (k, n), times in table.sort_index(level=["N", "K"], sort_remaining=False).iterrows():
        change = [float(times[b] / times[a] - 1.0) * 100.0 for a, b in STEP_PAIRS]
        jumps[f"{int(k)}x{int(n)}"] = [round(c, 1) for c in change]
        print(f"  {int(k):6d} {int(n):6d}  " + "  ".join(f"{c:+9.0f}" for c in change))
    series = {}
    for model, tp, op, spans in STEP_SERIES:
        profile = rows[(rows["model"] == model) & (rows["tp"] == tp) & (rows["op"] == op)]
        us = profile.set_index("num_tokens")["time_s"] * 1e6
        k, n = int(profile["K"].iloc[0]), int(profile["N"].iloc[0])
        quoted = []
        for lo, hi in spans:
            within = us[(us.index >= lo) & (us.index <= hi)]
            low, high = round(float(within.min()), 1), round(float(within.max()), 1)
            series[f"{model}/tp{tp}/{op}/{lo}-{hi}"] = [low, high]
            times = f"{low:g}" if low == high else f"{low:g}-{high:g}"
            quoted.append(f"{times} us at {lo}" + (f"-{hi}" if hi > lo else ""))
        print(f"  {model} TP {tp} {op} (K {k} x N {n}): " + ", ".join(quoted))
    return {"bench": "cost_model_steps", "step_pairs": STEP_PAIRS, "jumps_percent": jumps, "series_us": series}


CHOICE_TEMPERATURES: tuple[float, ...] = (0.1, 0.03)  # softmin temperatures of the learned choice, in log time


def _softmin_choice(log_times: np.ndarray, times: np.ndarray, bias: np.ndarray, temperature: float) -> np.ndarray:
    """Seconds of a kernel choice that weighs each tile shape (rows of `times`) by
    exp(-(log time + bias) / temperature): a library heuristic with a learned preference per shape
    (`bias`: shapes x rows)."""
    score = log_times + bias
    weight = np.exp(-(score - score.min(axis=0)) / temperature)
    return (weight * times).sum(axis=0) / weight.sum(axis=0)


def _fit_preference(
    times: np.ndarray, log_measured: np.ndarray, features: np.ndarray, temperature: float
) -> np.ndarray:
    """Weights (shapes x features) of the preference `features` make for each tile shape, fitted by
    soft-L1 least squares on log(chosen / measured), as the tile parameters are."""
    from scipy.optimize import least_squares

    log_times, shape = np.log(times), (len(times), len(features))

    def residuals(x: np.ndarray) -> np.ndarray:
        bias = x.reshape(shape) @ features
        return np.log(_softmin_choice(log_times, times, bias, temperature)) - log_measured

    fitted = least_squares(residuals, np.zeros(shape[0] * shape[1]), loss="soft_l1", f_scale=0.05, diff_step=1e-3)
    return fitted.x.reshape(shape)


def _oracle_per_group(report: Callable, rows: pd.DataFrame, times: np.ndarray, measured: np.ndarray) -> None:
    """A kernel per shape and band instead of per row: far fewer choices to absorb noise with."""
    log_times, log_measured = np.log(times), np.log(measured)
    octaves = tuple([0] + [2**i for i in range(4, 14)] + [1 << 20])
    for bins, name in ((TOKEN_BINS, "token band"), (octaves, "token octave")):
        group = pd.Series(zip(rows["K"], rows["N"], pd.cut(rows["num_tokens"], bins).astype(str))).factorize()[0]
        per_group = np.empty(len(rows))
        for members in pd.Series(np.arange(len(rows))).groupby(group).groups.values():
            idx = np.asarray(members)
            best = np.argmin(np.median(np.abs(log_times[:, idx] - log_measured[idx]), axis=1))
            per_group[idx] = times[best, idx]
        key = "oracle_per_band" if bins is TOKEN_BINS else "oracle_per_octave"
        report(f"oracle: one shape per (K, N) and {name}", key, per_group, measured)


def _learned_choice(
    report: Callable, rows: pd.DataFrame, times: np.ndarray, measured: np.ndarray, shipped: np.ndarray
) -> None:
    """A preference per tile shape in a softmin, fitted on one half of the dev split's shapes
    (every 8th token count) and scored on the other. The preference is a constant, or a constant
    and a slope in log K (the data's steps say cuBLAS runs taller tiles at longer K:
    docs/cost_model.md, "Where the steps are")."""
    from simulator.gemm_fit import shape_half

    log_times, log_measured = np.log(times), np.log(measured)
    thinned = (rows.groupby(["model", "tp", "op"]).cumcount() % 8 == 0).to_numpy()
    log_k = np.log(rows["K"].to_numpy(float) / 4096.0)
    forms = {"per shape": np.ones((1, len(rows))), "per shape and log K": np.stack([np.ones(len(rows)), log_k])}
    print(
        "Learned choice (a preference per tile shape in a softmin), dev split: fit on one half's shapes "
        "(every 8th token count), score the other:"
    )
    held_out = np.concatenate(
        [np.flatnonzero(~train) for seed in (0, 1) for train in (shape_half(rows, seed), ~shape_half(rows, seed))]
    )
    report("no preference: the shipped power mean, same rows", "dev_shipped", shipped[held_out], measured[held_out])
    for (form, features), temperature in itertools.product(forms.items(), CHOICE_TEMPERATURES):
        learned, truth = [], []
        for seed in (0, 1):
            in_half = shape_half(rows, seed)
            for train in (in_half, ~in_half):
                fit, test = np.flatnonzero(train & thinned), np.flatnonzero(~train)
                weights = _fit_preference(times[:, fit], log_measured[fit], features[:, fit], temperature)
                bias = weights @ features[:, test]
                learned.append(_softmin_choice(log_times[:, test], times[:, test], bias, temperature))
                truth.append(measured[test])
        key = f"learned_{form.replace(' ', '_')}_t{temperature:g}".replace(".", "_")
        report(f"{form}, temperature {temperature:g}", key, np.concatenate(learned), np.concatenate(truth))


def choice() -> dict:
    """`--choice`: how much of the tile model's error is the kernel choice. Each tile shape's time
    (at its best split-K, the shipped A100 parameters) per GEMM row; in-sample, the shipped power
    mean, the fastest shape alone, and the shape closest to the measured time (an oracle that knows
    the library's pick, a floor no rule can reach: the closest of eight also absorbs noise), or
    one shape per (K, N) and token band or octave (16-32, 32-64, ...; far fewer choices). Then a
    learned choice, one preference per tile shape in a softmin, fitted on one half of the dev
    split's shapes (every 8th token count) and scored on the other, beside the power mean on the
    same rows: whether the library's picks can be learned from other shapes."""
    from simulator.cost import load_a100_params
    from simulator.gemm import tile_shape_times
    from simulator.gemm_fit import A100

    start = time.perf_counter()
    rows = gemm_rows(load_vidur())
    params = load_a100_params().gemm
    assert params is not None, "the shipped A100 calibration has a GEMM fit"
    shipped = predict_tiles(rows, params)
    per_shape: dict[str, np.ndarray] = {}
    for (k, n), group in rows.groupby(["K", "N"], sort=False):
        idx = rows.index.get_indexer(group.index)
        for label, times in tile_shape_times(group["num_tokens"].to_numpy(float), k, n, A100, params).items():
            per_shape.setdefault(label, np.full(len(rows), np.nan))[idx] = times
    labels = list(per_shape)
    times = np.stack([per_shape[label] for label in labels])
    measured = rows["time_s"].to_numpy(float)
    log_times, log_measured = np.log(times), np.log(measured)
    closest = np.argmin(np.abs(log_times - log_measured), axis=0)
    columns = np.arange(len(rows))
    figures: dict = {"bench": "cost_model_choice"}

    def report(name: str, key: str, predicted: np.ndarray, truth: np.ndarray) -> None:
        ape = ape_percent(predicted, truth)
        median, p90 = float(np.median(ape)), float(np.percentile(ape, 90))
        print(f"  {name:62s} median {median:5.2f}  p90 {p90:5.2f}")
        figures.update({f"{key}_median_ape_percent": round(median, 2), f"{key}_p90_ape_percent": round(p90, 2)})

    print(
        f"Kernel choice, vidur A100 GEMMs ({len(rows)} rows, {len(labels)} tile shapes: {', '.join(labels)}), "
        "shipped parameters, in-sample:"
    )
    report("shipped: power mean over tile shapes (choice_q)", "shipped", shipped, measured)
    report("the model's fastest tile shape alone", "fastest", times.min(axis=0), measured)
    report("oracle: the shape closest to the measured time", "oracle", times[closest, columns], measured)
    _oracle_per_group(report, rows, times, measured)
    fastest_share = float(np.mean(closest == np.argmin(times, axis=0))) * 100.0
    print(f"  the closest shape is the model's fastest in {fastest_share:.1f}% of rows")
    figures["oracle_is_fastest_percent"] = round(fastest_share, 1)
    _learned_choice(report, rows, times, measured, shipped)
    figures["elapsed_s"] = round(time.perf_counter() - start, 1)
    return figures


def calibration() -> dict:
    """`--calibration`: each measured table fitted per part and scored on its held-out shapes."""
    keys = calibration_keys()
    for part in TRANSFER_PARTS:
        name = part.replace("-", "_")
        print(
            f"{part}: calibrated on its own GEMMs, held out ((K, N) shapes halved, two-fold), median / p90 APE "
            f"{keys[f'{name}_calibrated_heldout_median_ape_percent']} / "
            f"{keys[f'{name}_calibrated_heldout_p90_ape_percent']}%; the A100 fit carried "
            f"{keys[f'{name}_carried_heldout_median_ape_percent']} / {keys[f'{name}_carried_heldout_p90_ape_percent']}%"
        )
    return {"bench": "cost_model_calibration", **keys}


def holdout(quick: bool) -> dict:
    """The default run: both models refitted per fold, scored on the A100 shapes each fold never saw."""
    thin = 8 if quick else 2
    start = time.perf_counter()
    table = load_vidur()
    held = holdout_predictions(table, thin=thin)
    report = summary(held)
    elapsed = time.perf_counter() - start
    print(
        f"A100 GEMMs held out: {report['rows']} rows over 8 folds, {report['unseen_rows']} "
        f"with a (K, N) shape absent from their fold's fit set (tile model fitted on every "
        f"{ {2: '2nd', 8: '8th'}.get(thin, f'{thin}th') } token count; {elapsed:.0f} s)"
    )
    header = f"  {'unseen rows':26s} {'n':>6s}  {'tiles APE % median':>6s} {'p90':>4s}   {'old median':>6s} {'p90':>4s}"
    print(header)
    print(_row("all (pooled)", report))
    for key, title in (("by_family", "op family"), ("by_tokens", "tokens"), ("by_fold", "fold")):
        print(f"  -- per {title}")
        for name, entry in sorted(report[key].items()):
            print(_row(name, entry))
    print("  -- what a level per shape could fix at best (tile model, unseen rows)")
    floors = where_the_error_is(held[held["unseen"]], "fold", gemm_rows(table))
    return {
        "bench": "cost_model",
        "quick": quick,
        "fit_every_nth_token_count": thin,
        **unseen_keys(report),
        "unseen_rows": report["unseen_rows"],
        "heldout_rows": report["rows"],
        "by_family": {
            name: {
                "tiles_median": round(e["tiles"]["median"], 2),
                "tiles_p90": round(e["tiles"]["p90"], 2),
                "old_median": round(e["old"]["median"], 2),
                "old_p90": round(e["old"]["p90"], 2),
            }
            for name, e in sorted(report["by_family"].items())
        },
        **floors,
        "elapsed_s": round(elapsed, 1),
    }


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}%"


def kernels(path: str, part: str) -> dict:
    """The tile model's pick against the library's, per token count, on a part's own GEMM table
    with kernel names (`bench/gemm_profile.py --kernels`; simulator/kernel_names.py)."""
    import pandas as pd

    from profiler.errors import UsageError
    from simulator.hardware import get_hardware
    from simulator.kernel_names import library_vs_model

    table = pd.read_csv(path)
    missing = [c for c in ("m", "n", "k", "time_s", "kernels") if c not in table.columns]
    if missing:
        raise UsageError(f"{path}: needs the columns of bench/gemm_profile.py --kernels; missing {', '.join(missing)}")
    rows = table.rename(columns={"m": "M", "n": "N", "k": "K"})
    report = library_vs_model(rows, get_hardware(part))
    print(
        f"{path} on {part}: {report['named']} of {report['gemms']} GEMMs ran a kernel whose name gives its tile "
        "(tokens x N); per token count, the library's most common tile, the tile model's, and how often they agree"
    )
    for t in report["per_tokens"]:
        print(
            f"  {t['tokens']:6d} tokens ({t['gemms']:3d})  library {t['library']:>9s} (split-K {t['library_split_share']:.0%})"
            f"  model {t['model']:>9s} (split-K {t['model_split_share']:.0%})  agree {t['agree_share']:.0%}"
        )
    if report["per_tokens"]:
        print(
            f"  agree on {report['agree_share']:.0%} of GEMMs; the model's median APE where its tile is the library's "
            f"{_pct(report['agree_median_ape_percent'])}, where it is not {_pct(report['disagree_median_ape_percent'])}"
        )
    return {"bench": "cost_model_kernels", "table": path, "hardware": part, **report}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fit on every 8th token count")
    parser.add_argument(
        "--transfer",
        action="store_true",
        help="only the check on parts never fitted and both models' predictions on the catalog's GPUs",
    )
    parser.add_argument("--dev", action="store_true", help="score the tile model on the dev split of shapes")
    parser.add_argument(
        "--steps", action="store_true", help="only where the measured A100 profiles step, per shape (no model)"
    )
    parser.add_argument("--fix", action="append", default=[], metavar="NAME=VALUE", help="with --dev: fix a parameter")
    parser.add_argument(
        "--min", action="append", default=[], metavar="NAME=VALUE", help="with --dev: set a lower bound"
    )
    parser.add_argument(
        "--choice",
        action="store_true",
        help="only the kernel choice's share of the error: oracle and learned choices among the tile shapes",
    )
    parser.add_argument(
        "--calibration",
        action="store_true",
        help="only XLA's tables used the other way: the tile model calibrated on each part's own GEMMs (solm calibrate)",
    )
    parser.add_argument(
        "--kernels",
        metavar="TABLE",
        help="only the tile model's pick against the library's, on a GEMM table with kernel names "
        "(bench/gemm_profile.py --kernels; with --hardware)",
    )
    parser.add_argument("--hardware", help="with --kernels: the catalog part the table was timed on")
    parser.add_argument(
        "--half",
        choices=("dev", "test"),
        help="with --transfer: score one seeded half of each measured table (choose on dev, report test)",
    )
    args = parser.parse_args()
    modes = [flag for flag in ("transfer", "dev", "calibration", "steps", "choice") if getattr(args, flag)]
    if len(modes) > 1 or (modes and args.quick):
        parser.error(f"one mode at a time: --{' and --'.join(modes + ['quick'] * args.quick)} given together")
    if args.half and not args.transfer:
        parser.error("--half goes with --transfer")
    if (args.fix or args.min) and not args.dev:
        parser.error("--fix and --min go with --dev")
    if args.kernels is not None and (modes or args.quick or not args.hardware):
        parser.error("--kernels TABLE goes with --hardware PART alone")
    if args.hardware and args.kernels is None:
        parser.error("--hardware goes with --kernels")
    if args.kernels is not None:
        from profiler.errors import SolmError, error_line

        try:
            figures = kernels(args.kernels, args.hardware)
        except (SolmError, OSError, ValueError) as e:  # a bad table or part: one line, exit 2
            parser.error(error_line(e))
    elif args.steps:
        figures = steps()
    elif args.choice:
        figures = choice()
    elif args.dev:
        figures = dev(_settings(parser, args.fix), _settings(parser, args.min))
    elif args.calibration:
        figures = calibration()
    elif args.transfer:
        measured = measured_transfer(args.half)
        figures = {
            "bench": "cost_model_transfer",
            **transfer_keys(measured),
            "measured": measured,
            "llama_3_8b_up_proj": transfer(),
        }
    else:
        figures = holdout(args.quick)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
