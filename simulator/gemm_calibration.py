"""A part's own GEMM calibration: the tile model fitted on GEMM times measured on that part.

What: `read_gemm_table` reads a CSV of measured GEMMs (columns m, n, k and one of time_s,
time_ms, time_us or an achieved FLOP/s column such as bf16_flops_per_s, and optionally dtype,
which must be a 16-bit type; `bench/gemm_profile.py` writes one on any GPU with PyTorch), or a
vidur per-op profile (`<model>.mlp.csv`, its projections' GEMMs);
`calibrate` fits the tile-and-wave model's parameters (`simulator.gemm_fit.fit_gemm`, the same
fields and bounds as the shipped A100 fit) to it and scores the fit honestly first: the table's
distinct (K, N) shapes are shuffled (seed 0) and halved, the model fitted on one half and scored
on the other and the reverse, beside the A100 fit carried by physics (what the simulator uses
without a calibration) on the same rows; then the parameters are refitted on every row.
`GemmCalibration.to_json` is the file `solm calibrate` writes, `read_calibration` reads it back
(one UsageError line for anything else), and `with_gemm_calibration` attaches its parameters to a
part (`HardwareSpec.gemm_fit`), so every GEMM the simulator costs on that part uses them (`solm
cost` / `solm simulate --gemm-calibration`).
Why: the A100 fit carried by physics is the answer for a part nobody has measured; a user who
can time a few dozen GEMMs on their part gets that part's own kernels' efficiencies, launch cost
and choice spread instead, and the held-out figures say how much that buys before they trust it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profiler.errors import UsageError, cut, parse_json, quoted
from profiler.outdir import input_file
from simulator.csv_input import read_csv_table
from simulator.gemm import GemmParams
from simulator.hardware import HardwareSpec

FORMAT = "solm-gemm-calibration"
VERSION = 1
# larger files are not a GEMM table (a Vidur profile is ~1 MB) nor a calibration (~1 KB): a 20 GiB sparse
# file read whole ran for minutes (a table) or was killed for memory (a calibration)
MAX_TABLE_BYTES = 256 << 20
MAX_CALIBRATION_BYTES = 1 << 20
TIME_COLUMNS: dict[str, float] = {"time_s": 1.0, "time_ms": 1e-3, "time_us": 1e-6}  # column -> seconds
SIXTEEN_BIT = {"bfloat16", "bf16", "float16", "fp16", "half"}  # accepted values of an optional dtype column
MIN_ROWS = 8  # fewer measured GEMMs than this cannot pin seven parameters
MIN_SHAPES_FOR_SPLIT = 4  # (K, N) shapes needed to hold half of them out
BOOLEANS = {"true": True, "false": False, "1": True, "0": False}  # a vidur profile's use_gated_mlp, as text
MAX_COLUMNS_NAMED = 8  # an error line names at most this many of a table's columns


def _column_list(columns: pd.Index) -> str:
    """The columns found, for an error line: the first few, each cut (a binary file's header was the whole line)."""
    names = [cut(str(c), 30) for c in columns]
    more = f", ... ({len(names)} columns)" if len(names) > MAX_COLUMNS_NAMED else ""
    return (", ".join(names[:MAX_COLUMNS_NAMED]) + more) or "none"


def read_gemm_table(path: str | Path) -> pd.DataFrame:
    """The measured GEMMs as rows of num_tokens (M), K, N and time_s (UsageError, one line, for
    anything malformed)."""
    path = input_file(path, "GEMM table", MAX_TABLE_BYTES)
    table = read_csv_table(path, "CSV table of GEMMs")
    if any(str(c).startswith("time_stats.") for c in table.columns):
        return _vidur_gemms(path, table)
    columns = {str(c).strip().lower(): c for c in table.columns}
    missing = [c for c in ("m", "n", "k") if c not in columns]
    times = [c for c in TIME_COLUMNS if c in columns]
    rates = [c for c in columns if c.endswith("flops_per_s")]
    if missing or not (times or rates):
        raise UsageError(
            f"{path}: needs columns m, n, k and one of {', '.join(TIME_COLUMNS)} or an achieved "
            f"FLOP/s column (e.g. bf16_flops_per_s); found {_column_list(table.columns)}"
        )
    if not len(table):
        raise UsageError(f"{path}: no GEMMs")
    if "dtype" in columns:
        kinds = sorted({str(v).strip().lower() for v in table[columns["dtype"]]} - SIXTEEN_BIT)
        if kinds:
            raise UsageError(
                f"{path}: dtype {kinds[0]}: the tile model is fitted on 16-bit GEMMs (bfloat16, float16); "
                f"time those (bench/gemm_profile.py --dtype bfloat16)"
            )
    values: dict[str, np.ndarray] = {}
    for name in ("m", "n", "k", *(times[:1] or rates[:1])):
        col = pd.to_numeric(table[columns[name]], errors="coerce").to_numpy(float)
        bad = np.flatnonzero(~(np.isfinite(col) & (col > 0)))
        if len(bad):
            raise UsageError(
                f"{path}: row {bad[0] + 1}: {columns[name]} must be a positive number, got {quoted(str(table[columns[name]].iloc[bad[0]]))}"
            )
        if name in ("m", "n", "k"):
            bad = np.flatnonzero((col != np.round(col)) | (col > 1 << 24))
            if len(bad):
                raise UsageError(f"{path}: row {bad[0] + 1}: {columns[name]} must be a whole number up to 2^24")
        values[name] = col
    m, n, k = values["m"], values["n"], values["k"]
    if times:
        time_s = values[times[0]] * TIME_COLUMNS[times[0]]
    else:
        with np.errstate(over="ignore"):  # an overflow is refused just below, not warned of
            time_s = 2.0 * m * n * k / values[rates[0]]
    bad = np.flatnonzero(~np.isfinite(time_s))  # was: a rate of 1e-300 overflowed to an infinite time, scipy's error
    if len(bad):
        name = columns[(times or rates)[0]]
        raise UsageError(
            f"{path}: row {bad[0] + 1}: {name} {quoted(str(table[name].iloc[bad[0]]))} gives the "
            f"{m[bad[0]]:.0f}x{k[bad[0]]:.0f}x{n[bad[0]]:.0f} GEMM (M x K x N) no finite time"
        )
    return pd.DataFrame({"num_tokens": m, "K": k, "N": n, "time_s": time_s})


def _vidur_gemms(path: Path, wide: pd.DataFrame) -> pd.DataFrame:
    """The GEMM rows (QKV, output, up and down projections) of a vidur per-op profile: each row's
    (K, N) from the layer shape and TP degree the file records."""
    from simulator.calibrate import VIDUR_DIMS, VIDUR_KEYS, read_vidur_csv
    from simulator.gemm_fit import gemm_rows

    wide = wide.copy()
    for column in (*VIDUR_KEYS, *VIDUR_DIMS[:-1]):  # every dimension but use_gated_mlp is a count
        if column not in wide.columns:
            raise UsageError(f"{path}: a vidur profile without its column {column!r}")
        values = pd.to_numeric(wide[column], errors="coerce")
        bad = np.flatnonzero(~(np.isfinite(values) & (values >= 1) & (values == np.round(values))))
        if len(bad):
            raise UsageError(
                f"{path}: row {bad[0] + 1}: {column} must be a whole number >= 1, got {quoted(str(wide[column].iloc[bad[0]]))}"
            )
        wide[column] = values.astype(np.int64)
    if "use_gated_mlp" not in wide.columns:
        raise UsageError(f"{path}: a vidur profile without its column 'use_gated_mlp'")
    gated = wide["use_gated_mlp"].map(lambda v: BOOLEANS.get(str(v).strip().lower()))
    bad = np.flatnonzero(gated.isna())
    if len(bad):  # was: bool() of the text, so "maybe" and, beside it, "False" read as True: gated MLP shapes
        raise UsageError(
            f"{path}: row {bad[0] + 1}: use_gated_mlp must be True or False, got {quoted(str(wide['use_gated_mlp'].iloc[bad[0]]))}"
        )
    wide["use_gated_mlp"] = gated.astype(bool)
    split = wide["n_head"] % wide["num_tensor_parallel_workers"] != 0
    if split.any():
        row = wide[split].iloc[0]
        raise UsageError(
            f"{path}: num_tensor_parallel_workers {row['num_tensor_parallel_workers']} does not divide n_head {row['n_head']}"
        )
    for column in [c for c in wide.columns if str(c).startswith("time_stats.")]:
        values = pd.to_numeric(wide[column], errors="coerce")  # an empty cell drops its row below
        bad = np.flatnonzero(values.isna() & wide[column].notna())
        if len(bad):
            raise UsageError(
                f"{path}: row {bad[0] + 1}: {column} is not a number ({quoted(str(wide[column].iloc[bad[0]]))})"
            )
        if column.endswith(".median"):  # the time read: was, a negative, 0 or inf one was the median of its
            # token count's repeats, or dropped as if not measured, and the file read as clean
            bad = np.flatnonzero(values.notna() & ~(np.isfinite(values) & (values > 0)))
            if len(bad):
                raise UsageError(
                    f"{path}: row {bad[0] + 1}: {column} must be a positive number of ms, got {quoted(str(wide[column].iloc[bad[0]]))}"
                )
        wide[column] = values
    try:
        rows = gemm_rows(read_vidur_csv(path, wide))
    except KeyError as error:
        raise UsageError(f"{path}: a vidur profile without its column {error.args[0]!r}") from None
    except (ValueError, TypeError, ZeroDivisionError) as error:
        raise UsageError(f"{path}: a vidur profile whose layer shape or times cannot be read ({error})") from None
    rows = rows[np.isfinite(rows["time_s"].to_numpy(float))]
    bad = rows[~((rows["time_s"] > 0) & (rows["num_tokens"] >= 1))]
    if len(bad):
        raise UsageError(
            f"{path}: {bad.iloc[0]['op']} at {bad.iloc[0]['num_tokens']} tokens: time and tokens must be > 0"
        )
    if not len(rows):
        raise UsageError(f"{path}: no GEMM timings in the vidur profile")
    return rows[["num_tokens", "K", "N", "time_s"]].astype(float).reset_index(drop=True)


@dataclass(frozen=True)
class GemmCalibration:
    """Fitted parameters and the figures that judge them."""

    hardware: str
    params: GemmParams
    rows: int
    shapes: int
    source: str
    heldout: dict[str, Any]  # {"fitted": {median, p90, n}, "carried": {...}, "split": str}
    in_sample: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "hardware": self.hardware,
            "params": self.params.to_json(),
            "rows": self.rows,
            "shapes": self.shapes,
            "source": self.source,
            "heldout": self.heldout,
            "in_sample": self.in_sample,
        }


def _ape_stats(predicted: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    from simulator.gemm_fit import ape_percent

    ape = ape_percent(predicted, measured)
    return {"median": round(float(np.median(ape)), 2), "p90": round(float(np.percentile(ape, 90)), 2), "n": len(ape)}


def _halves(rows: pd.DataFrame, seed: int) -> tuple[np.ndarray, str]:
    """A boolean mask of one half: whole (K, N) shapes when there are enough of them, else rows."""
    from simulator.gemm_fit import shape_half

    if len(set(zip(rows["K"], rows["N"]))) >= MIN_SHAPES_FOR_SPLIT:
        return shape_half(rows, seed), "(K, N) shapes halved"
    mask = np.zeros(len(rows), bool)
    mask[np.random.default_rng(seed).permutation(len(rows))[::2]] = True
    return mask, "rows halved (too few shapes to hold whole ones out)"


MAX_PEAK_SHARE = 2.0  # a GEMM faster than twice the part's dense tensor peak was not timed on it
# a refit on every GEMM that still misses half of them by 2x or more (the XLA tables' is ~4%) has not
# found this part's kernels: times slower by a unit (us read as s) pinned every parameter at a bound
MAX_FIT_MEDIAN_APE = 50.0


def _check_below_peak(rows: pd.DataFrame, hardware: HardwareSpec, source: str) -> None:
    """UsageError naming the first GEMM whose time implies more than MAX_PEAK_SHARE x the part's peak
    (another part's times, or times in another unit: a fit to them wrote absurd parameters)."""
    m, k, n, t = (rows[c].to_numpy(float) for c in ("num_tokens", "K", "N", "time_s"))
    achieved = 2.0 * m * k * n / t
    bad = np.flatnonzero(achieved > MAX_PEAK_SHARE * hardware.peak_flops_per_s)
    if len(bad):
        i = bad[0]
        raise UsageError(
            f"{source or 'the tables'}: the {m[i]:.0f}x{k[i]:.0f}x{n[i]:.0f} GEMM (M x K x N) in {t[i]:.3g} s runs at "
            f"{achieved[i] / 1e12:.3g} TFLOP/s, over {MAX_PEAK_SHARE:g}x {hardware.name}'s {hardware.peak_flops_per_s / 1e12:.0f} "
            f"TFLOP/s peak; these times are not from this part (or not in the unit their column names)"
        )


def calibrate(rows: pd.DataFrame, hardware: HardwareSpec, source: str = "", seed: int = 0) -> GemmCalibration:
    """Held-out figures (two-fold over halves), then the parameters refitted on every row."""
    from simulator.cost import default_params
    from simulator.gemm_fit import FIXED_FROM_DATASHEETS, fit_gemm, predict_tiles

    if not hardware.has_chip_layout:
        raise UsageError(f"hardware {hardware.name!r} has no chip layout (num_sms, clocks, L2, arch) to calibrate")
    if len(rows) < MIN_ROWS:
        raise UsageError(f"{len(rows)} GEMMs from {source or 'the tables'}; a calibration needs at least {MIN_ROWS}")
    _check_below_peak(rows, hardware, source)
    uncalibrated = dataclasses.replace(hardware, gemm_fit=None)
    carried = default_params(uncalibrated).gemm
    assert carried is not None, "a part with a chip layout has tile parameters"
    rows = rows.reset_index(drop=True)
    half, split = _halves(rows, seed)
    fitted = np.empty(len(rows))
    for train in (half, ~half):
        params = fit_gemm(rows[train], uncalibrated, fixed=FIXED_FROM_DATASHEETS)
        fitted[~train] = predict_tiles(rows[~train].reset_index(drop=True), params, uncalibrated)
    measured = rows["time_s"].to_numpy(float)
    heldout = {
        "split": f"{split}, seed {seed}: fitted on one half, scored on the other, and the reverse",
        "fitted": _ape_stats(fitted, measured),
        "carried": _ape_stats(predict_tiles(rows, carried, uncalibrated), measured),
    }
    final = fit_gemm(rows, uncalibrated, fixed=FIXED_FROM_DATASHEETS)
    in_sample = _ape_stats(predict_tiles(rows, final, uncalibrated), measured)
    if in_sample["median"] >= MAX_FIT_MEDIAN_APE:  # was: times 1e6x too slow fitted to the bounds and written
        raise UsageError(
            f"{source or 'the tables'}: the tile model fitted within its bounds misses these GEMMs by a median "
            f"{in_sample['median']:.0f}% (a usable fit misses by under {MAX_FIT_MEDIAN_APE:.0f}%); these times are not from "
            f"{hardware.name} (or not in the unit their column names)"
        )
    return GemmCalibration(
        hardware=hardware.name,
        params=final,
        rows=len(rows),
        shapes=len(set(zip(rows["K"], rows["N"]))),
        source=source,
        heldout=heldout,
        in_sample=in_sample,
    )


def read_calibration(path: str | Path) -> tuple[str, GemmParams]:
    """(part it was fitted on, parameters) from a file `solm calibrate` wrote (UsageError if not one)."""
    path = input_file(path, "GEMM calibration", MAX_CALIBRATION_BYTES)
    try:
        text = path.read_bytes()
    except OSError as error:
        raise UsageError(f"GEMM calibration {path}: cannot read it ({error.strerror})") from None
    data = parse_json(text, f"GEMM calibration {path}")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UsageError(f"GEMM calibration {path}: not a solm GEMM calibration (write one with `solm calibrate`)")
    if data.get("version") != VERSION:
        raise UsageError(f"GEMM calibration {path}: version {data.get('version')!r}, this solm reads {VERSION}")
    raw = data.get("params")
    fields = {f.name for f in dataclasses.fields(GemmParams)}
    if not isinstance(raw, dict) or set(raw) != fields:
        raise UsageError(f"GEMM calibration {path}: params must name exactly {', '.join(sorted(fields))}")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in raw.values()):
        raise UsageError(f"GEMM calibration {path}: params must be finite numbers")
    try:
        params = GemmParams.from_json(raw)
    except ValueError as error:
        raise UsageError(f"GEMM calibration {path}: {error}") from None
    _check_fit_bounds(path, params)
    return str(data.get("hardware", "")), params


def _check_fit_bounds(path: Path, params: GemmParams) -> None:
    """A parameter outside the box `solm calibrate` fits in (widened to hold GemmParams' defaults:
    choice_q 0, the fastest kernel) was not written by it. Inside GemmParams' own ranges but far out
    (tensor_eff 5e-324, fill_iters or launch_overheads 1e308) the tile model's times came out NaN or
    1e307 ms, printed with exit 0."""
    from simulator.gemm_fit import _LOWER, _UPPER, FIT_FIELDS

    default = GemmParams()
    for name, fit_low, fit_high in zip(FIT_FIELDS, _LOWER, _UPPER, strict=True):
        low = min(float(fit_low), float(getattr(default, name)))
        high = max(float(fit_high), float(getattr(default, name)))
        value = float(getattr(params, name))
        slack = 1e-9 * max(1.0, abs(high))
        if not low - slack <= value <= high + slack:
            raise UsageError(
                f"GEMM calibration {path}: params.{name} is {value:g}, outside {low:g}..{high:g}, "
                f"the range `solm calibrate` fits it in"
            )


def gemm_fit_of(params: GemmParams) -> tuple[tuple[str, float], ...]:
    """`params` as `HardwareSpec.gemm_fit` holds them: (field, value) pairs."""
    return tuple((k, float(v)) for k, v in params.to_json().items())


def calibrated_part(hardware: HardwareSpec, path: str | Path) -> tuple[HardwareSpec, str]:
    """(the part with the calibration file's parameters attached as `HardwareSpec.gemm_fit`, the part
    the file was fitted on). A calibration serves the parts of the kernel family it was fitted on
    (an H100's serves an H200, the same die), not another family's."""
    from simulator.hardware import HARDWARE

    if not hardware.has_chip_layout:
        raise UsageError(f"--gemm-calibration: hardware {hardware.name!r} has no chip layout for the GEMM tile model")
    fitted_on, params = read_calibration(path)
    origin = HARDWARE.get(fitted_on)
    if origin is None or origin.arch != hardware.arch:
        family = f" ({origin.arch})" if origin is not None else " (not a catalog part)"
        raise UsageError(
            f"--gemm-calibration {path}: fitted on {fitted_on or '?'}{family}; its tile efficiencies describe "
            f"that kernel family, not {hardware.name}'s ({hardware.arch})"
        )
    calibrated = dataclasses.replace(
        hardware,
        gemm_fit=gemm_fit_of(params),
        source=f"{hardware.source}; GEMM tile model calibrated on {fitted_on} ({path})",
    )
    return calibrated, fitted_on


def with_gemm_calibration(hardware: HardwareSpec, path: str | Path) -> HardwareSpec:
    """The part with the calibration file's parameters attached (`calibrated_part`)."""
    return calibrated_part(hardware, path)[0]
