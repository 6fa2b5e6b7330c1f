"""Calibration: fit the cost model's efficiencies to measured times (least squares).

What, two sources:
(a) the public vidur A100 per-operator profiles (`simulator/data/vidur-a100/*.mlp.csv`: one
    transformer layer of Llama-2-7B/70B, Llama-3-8B and Phi-2 on one tensor-parallel shard, 1 to
    32768 tokens, TP 1-8). For each op family, the four `OpEfficiency` numbers are fitted on the
    `a100-80g` spec by minimising log(predicted / measured), i.e. relative error.
(b) measured steps of a trace `(query_tokens, kv_tokens_read, duration_s[, query_groups])`:
    `fit_steps` fits a whole-step line (overhead + per-query-token + per-KV-token seconds), and
    `fit_cost_params_to_steps` rescales a `CostParams` (compute and memory efficiencies, step
    overhead) so that `CostModel.step_time_s` matches the trace, e.g. a CPU capture.

The tile-and-wave GEMM parameters (`CostParams.gemm`, `simulator.gemm_fit.fit_gemm`) are fitted
on the same data's GEMM rows by `write_a100_calibration`; their held-out error on unseen shapes
is reported by bench/cost_model.py (`simulator.gemm_fit.holdout_predictions` and `summary`).

Held-out error: the fits report median absolute percentage error (APE) on rows they did not see.
Default split "interleaved": within each (model, TP) profile sorted by token count, even rows
train and odd rows test (measures interpolation between token counts). Split "model": leave one
model out, fit on the other three (measures transfer to an unseen shape). The shipped calibration
(`simulator/data/a100_calibration.json`, rebuilt by `write_a100_calibration()`) is fitted on all
rows and records both held-out reports.

Not calibrated here: attention (the vidur mlp.csv files hold no attention kernels), so the
`attention_prefill` / `attention_decode` families keep their priors; the lm_head borrows the
fused gate+up projection's fit.

Run `python -m simulator.calibrate` to refit, print the errors and rewrite the JSON file.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from simulator.cost import (
    CALIBRATION_PATH,
    OP_FAMILY,
    RESIDUAL_ADDS_PER_LAYER,
    CostModel,
    CostParams,
    OpEfficiency,
    layer_work,
    op_time_s,
    pass_work,
)
from simulator.hardware import HARDWARE, HardwareSpec
from simulator.models import ModelSpec

# measured steps: rows of (query_tokens, kv_tokens_read, duration_s[, query_groups]), lists or an (N, 3|4) array
Steps = Sequence[Sequence[float]] | np.ndarray

VIDUR_DIR = Path(__file__).resolve().parent / "data" / "vidur-a100"  # copied in, see its README
VIDUR_OPS: tuple[str, ...] = (
    "emb",
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
A100 = HARDWARE["a100-80g"]  # vidur profiles an A100 80GB (vidur device_sku_config.py)

# Bounds of (compute_eff_max, compute_half_tokens, memory_eff, overhead_launches). Elementwise
# families fit all four too: their "compute" roof is the CUDA-core throughput (A100 fp32 non-tensor
# peak is 19.5 of 312 TFLOP/s, 6%), which bends their time upward at large token counts.
_LOWER = np.array([0.005, 0.5, 0.05, 0.0])
_UPPER = np.array([1.0, 4096.0, 1.0, 25.0])


# ---- (a) vidur A100 per-op profiles ---------------------------------------------------------
def load_vidur(data_dir: Path | str | None = None) -> pd.DataFrame:
    """Long table: model, tp, num_tokens, op, time_s, and the layer shape of each row.

    Duplicated (model, tp, tokens) rows are merged by their median. FileNotFoundError if the
    directory holds no CSV.
    """
    data_dir = Path(data_dir) if data_dir is not None else VIDUR_DIR
    paths = sorted(data_dir.glob("*.mlp.csv"))
    if not paths:
        raise FileNotFoundError(f"no vidur CSV files in {data_dir}")
    table = pd.concat([read_vidur_csv(path) for path in paths], ignore_index=True)
    return table.sort_values(["model", "tp", "op", "num_tokens"], ignore_index=True)


VIDUR_KEYS = ("num_tensor_parallel_workers", "num_tokens")
VIDUR_DIMS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp")


def read_vidur_csv(path: Path | str, wide: pd.DataFrame | None = None) -> pd.DataFrame:
    """One vidur per-op profile (`<model>.mlp.csv` as vidur's profiler writes it) as the long
    table `load_vidur` returns; `wide` is the file already read. KeyError naming a missing column."""
    path = Path(path)
    wide = pd.read_csv(path) if wide is None else wide
    missing = [c for c in (*VIDUR_KEYS, *VIDUR_DIMS) if c not in wide.columns]
    if missing:
        raise KeyError(missing[0])
    keys, dims = list(VIDUR_KEYS), list(VIDUR_DIMS)
    cols = [f"time_stats.{op}.median" for op in VIDUR_OPS if f"time_stats.{op}.median" in wide.columns]
    wide = wide.groupby(keys, as_index=False).agg({**{c: "median" for c in cols}, **{d: "first" for d in dims}})
    long = wide.melt(id_vars=keys + dims, value_vars=cols, var_name="op", value_name="time_ms")
    long["op"] = long["op"].str.removeprefix("time_stats.").str.removesuffix(".median")
    long["model"] = path.name.split(".")[0]
    # Phi-2 (parallel attention/MLP) has no post-attention norm column.
    long["parallel_attn_mlp"] = "time_stats.post_attention_layernorm.median" not in cols
    long = long.rename(columns={"num_tensor_parallel_workers": "tp"})
    long["time_s"] = long.pop("time_ms") / 1e3
    long["family"] = long["op"].map(OP_FAMILY)
    return long


def _spec_of(row: pd.Series) -> ModelSpec:
    """A one-layer ModelSpec with the shape a vidur row was profiled on."""
    return ModelSpec(
        name=str(row["model"]),
        n_layers=1,
        d_model=int(row["n_embd"]),
        n_heads=int(row["n_head"]),
        n_kv_heads=int(row["n_kv_head"]),
        d_ff=int(row["n_expanded_embd"]),
        vocab_size=int(row["vocab_size"]),
        gated_mlp=bool(row["use_gated_mlp"]),
        parallel_attn_mlp=bool(row["parallel_attn_mlp"]),
    )


def _work_arrays(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(flops, bytes, launches, tokens) per row, as the cost model counts one op instance."""
    flops, bytes_, launches = (np.empty(len(rows)) for _ in range(3))
    for (_model, tp, op), group in rows.groupby(["model", "tp", "op"], sort=False):
        spec = _spec_of(group.iloc[0])
        n = group["num_tokens"].to_numpy(float)
        if op == "emb":
            work = pass_work(spec, n, n, int(tp))["emb"]
        else:
            work = layer_work(spec, n, int(tp))[op]
        scale = 1.0 / RESIDUAL_ADDS_PER_LAYER if op == "add" else 1.0  # vidur times one add
        idx = rows.index.get_indexer(group.index)
        flops[idx], bytes_[idx], launches[idx] = (np.broadcast_to(w, n.shape) * scale for w in work)
    return flops, bytes_, launches, rows["num_tokens"].to_numpy(float)


def _predict(x: np.ndarray, work: tuple[np.ndarray, ...], hardware: HardwareSpec, smooth_p: float) -> np.ndarray:
    flops, bytes_, launches, tokens = work
    eff = OpEfficiency(*x)
    return np.asarray(op_time_s((flops, bytes_, launches), tokens, eff, hardware, smooth_p))


def fit_family(
    rows: pd.DataFrame, hardware: HardwareSpec = A100, smooth_p: float = 4.0, start: OpEfficiency | None = None
) -> OpEfficiency:
    """Least-squares fit of one family's efficiencies on measured rows (log residuals)."""
    work = _work_arrays(rows.reset_index(drop=True))
    measured = rows["time_s"].to_numpy(float)
    start = start or OpEfficiency(hardware.matmul_efficiency, 64.0, hardware.memory_efficiency, 1.0)
    x0 = np.clip(np.array(dataclasses.astuple(start), dtype=float), _LOWER, _UPPER)

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.log(_predict(x, work, hardware, smooth_p) / measured)

    result = least_squares(residuals, x0, bounds=(_LOWER, _UPPER), x_scale=np.maximum(np.abs(x0), 1e-2), method="trf")
    return OpEfficiency(*(float(v) for v in result.x))


def fit_a100(table: pd.DataFrame, smooth_p: float = 4.0, source: str = "vidur-a100") -> CostParams:
    """CostParams with every vidur-measured family fitted; the rest keep A100 priors."""
    prior = CostParams.prior(A100)
    families = dict(prior.families)
    for family, rows in table.groupby("family"):
        families[str(family)] = fit_family(rows, A100, smooth_p, prior.families[str(family)])
    return dataclasses.replace(prior, families=families, smooth_p=smooth_p, source=source)


def _split(table: pd.DataFrame, split: str) -> Iterable[tuple[pd.DataFrame, pd.DataFrame]]:
    if split == "interleaved":
        rank = table.groupby(["model", "tp", "op"]).cumcount()
        yield table[rank % 2 == 0], table[rank % 2 == 1]
    elif split == "model":
        for model in sorted(table["model"].unique()):
            yield table[table["model"] != model], table[table["model"] == model]
    else:
        raise ValueError(f"unknown split {split!r}; valid: interleaved, model")


def heldout_errors(table: pd.DataFrame, split: str = "interleaved", smooth_p: float = 4.0) -> dict[str, float]:
    """Median absolute percentage error per op family on held-out rows."""
    ape: dict[str, list[np.ndarray]] = {}
    for train, test in _split(table, split):
        params = fit_a100(train, smooth_p)
        for family, rows in test.groupby("family"):
            rows = rows.reset_index(drop=True)
            x = np.array(dataclasses.astuple(params.families[str(family)]))
            predicted = _predict(x, _work_arrays(rows), A100, smooth_p)
            measured = rows["time_s"].to_numpy(float)
            ape.setdefault(str(family), []).append(np.abs(predicted / measured - 1) * 100)
    return {family: float(np.median(np.concatenate(ape[family]))) for family in sorted(ape)}


def a100_op_errors(data_dir: Path | str | None = None, split: str = "interleaved") -> dict[str, float]:
    """Held-out median APE (percent) per op family of the A100 calibration, for benchmarks."""
    return heldout_errors(load_vidur(data_dir), split)


def write_a100_calibration(data_dir: Path | str | None = None, path: Path = CALIBRATION_PATH) -> dict[str, Any]:
    """Refit on all vidur rows and write params + held-out error reports to `path`.

    The per-family roofline (CPU-style `families`, also the old GEMM model) is fitted on every
    row; the tile-and-wave GEMM parameters (`gemm`) on every second token count of each GEMM
    profile (`gemm_fit.fit_gemm`, about a minute); their held-out error is bench/cost_model.py's.
    """
    from simulator.gemm_fit import (
        FIXED_FROM_DATASHEETS,
        fit_gemm,
        gemm_rows,
        predict_tiles,
    )

    table = load_vidur(data_dir)
    rows = gemm_rows(table)
    gemm = fit_gemm(rows, thin=2, fixed=FIXED_FROM_DATASHEETS)
    params = dataclasses.replace(fit_a100(table), gemm=gemm, source="vidur-a100 (tile-and-wave GEMMs)")
    ape = np.abs(predict_tiles(rows, gemm) / rows["time_s"].to_numpy(float) - 1) * 100
    payload = {
        "command": "python -m simulator.calibrate",
        "params": params.to_json(),
        "report": {
            "gemm_fit": {
                "rows": len(rows),
                "fitted_on": "every 2nd token count",
                "fixed": FIXED_FROM_DATASHEETS,
                "in_sample_median_ape_percent": float(np.median(ape)),
                "in_sample_p90_ape_percent": float(np.percentile(ape, 90)),
                "heldout": "python bench/cost_model.py (docs/cost_model.md)",
            },
            "hardware": A100.name,
            "data": "microsoft/vidur data/profiling/compute/a100/*/mlp.csv (commit 7d47513)",
            "models": sorted(table["model"].unique()),
            "op_rows": len(table),
            "fitted_on": "all rows",
            "heldout_median_ape_percent": {
                "interleaved": heldout_errors(table, "interleaved"),
                "leave_one_model_out": heldout_errors(table, "model"),
            },
            "not_calibrated": ["attention_prefill", "attention_decode"],
        },
    }
    payload = _rounded(payload)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return payload


def _rounded(value: Any, digits: int = 6) -> Any:
    """Floats to `digits` significant digits, so the shipped JSON diffs cleanly."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {key: _rounded(item, digits) for key, item in value.items()}
    if isinstance(value, list):
        return [_rounded(item, digits) for item in value]
    return value


# ---- (b) measured steps of a trace ----------------------------------------------------------
@dataclass(frozen=True)
class StepFit:
    """duration_s = overhead_s + per_query_token_s * query_tokens + per_kv_token_s * kv_read."""

    overhead_s: float
    per_query_token_s: float
    per_kv_token_s: float
    n_steps: int = 0
    heldout_median_ape_percent: float | None = None  # fit on even steps, tested on odd ones

    def predict_s(self, query_tokens: float | np.ndarray, kv_tokens_read: float | np.ndarray) -> float | np.ndarray:
        return self.overhead_s + self.per_query_token_s * query_tokens + self.per_kv_token_s * kv_tokens_read

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepFit:
        return cls(**data)


# Measured steps on a shared CPU are noisy (a 1 ms decode step sometimes takes 10 ms when
# another process runs): a soft-L1 loss treats residuals beyond ~10% as outliers.
_ROBUST_LOSS = "soft_l1"
_F_SCALE = 0.1


def _steps_array(steps: Steps) -> np.ndarray:
    array = np.asarray(steps, dtype=float)
    if array.ndim != 2 or array.shape[1] not in (3, 4) or len(array) < 4:
        raise ValueError("steps must be >= 4 rows of (query_tokens, kv_tokens_read, duration_s[, query_groups])")
    if np.any(array[:, 2] <= 0) or np.any(array[:, 0] < 1) or np.any(array[:, 1] < 0):
        raise ValueError("steps need query_tokens >= 1, kv_tokens_read >= 0, duration_s > 0")
    return array


def _fit_line(array: np.ndarray) -> np.ndarray:
    q, kv, duration = array[:, 0], array[:, 1], array[:, 2]
    design = np.stack([np.ones_like(q), q, kv], axis=1) / duration[:, None]  # relative error
    scale = np.array(
        [np.median(duration), np.median(duration) / np.median(q), np.median(duration) / max(np.median(kv), 1.0)]
    )
    result = least_squares(
        lambda x: design @ x - 1.0,
        scale,
        bounds=(0.0, np.inf),
        x_scale=scale,
        method="trf",
        loss=_ROBUST_LOSS,
        f_scale=_F_SCALE,
    )
    return result.x


def fit_steps(steps: Steps) -> StepFit:
    """Fit a whole-step line to measured steps; report held-out error (even fit, odd test)."""
    array = _steps_array(steps)
    train, test = array[0::2], array[1::2]
    x_train = _fit_line(train)
    predicted = x_train[0] + x_train[1] * test[:, 0] + x_train[2] * test[:, 1]
    heldout = float(np.median(np.abs(predicted / test[:, 2] - 1)) * 100)
    x = _fit_line(array)
    return StepFit(float(x[0]), float(x[1]), float(x[2]), len(array), heldout)


def fit_cost_params_to_steps(
    hardware: HardwareSpec, model: ModelSpec, steps: Steps, base: CostParams | None = None
) -> CostParams:
    """Rescale `base` so that `CostModel(hardware, model).step_time_s` matches measured steps.

    Three numbers are fitted: a factor on every compute efficiency, one on every memory
    efficiency (both capped so no efficiency exceeds 1; the tile model's tensor and HBM
    efficiencies included) and the per-step overhead. The shape of
    each op's curve stays that of `base` (priors for CPUs, the A100 fit for GPUs).
    """
    array = _steps_array(steps)
    base = base or CostModel(hardware, model).params
    q, kv, duration = array[:, 0], array[:, 1], array[:, 2]
    groups = array[:, 3] if array.shape[1] == 4 else np.ones_like(q)

    def scaled(x: np.ndarray) -> CostParams:
        return dataclasses.replace(
            base.scaled(float(x[0]), float(x[1])),
            step_overhead_s=float(x[2]),
            source=f"{base.source} fitted to {len(array)} steps",
        )

    def residuals(x: np.ndarray) -> np.ndarray:
        predicted = CostModel(hardware, model, scaled(x)).step_time_s(q, kv, groups)
        return np.log(predicted / duration)

    x0 = np.array([1.0, 1.0, float(np.min(duration)) * 0.1])
    result = least_squares(
        residuals,
        x0,
        bounds=([1e-3, 1e-3, 0.0], [1e3, 1e3, np.inf]),
        x_scale=np.maximum(x0, 1e-6),
        method="trf",
        loss=_ROBUST_LOSS,
        f_scale=_F_SCALE,
    )
    return scaled(result.x)


def _main() -> None:
    from simulator.gemm_fit import gemm_rows

    payload = write_a100_calibration()
    gemm = payload["report"]["gemm_fit"]
    rows = gemm_rows(load_vidur())
    shapes = len(rows.groupby(["K", "N"]))
    tokens = f"{int(rows['num_tokens'].min())} to {int(rows['num_tokens'].max())} tokens"
    print(
        f"tile-and-wave GEMM fit ({gemm['rows']} rows over {shapes} (K, N) shapes, {tokens}): in-sample median APE "
        f"{gemm['in_sample_median_ape_percent']:.1f}%, p90 {gemm['in_sample_p90_ape_percent']:.1f}%;"
        f" params {payload['params']['gemm']}"
    )
    report = payload["report"]["heldout_median_ape_percent"]
    print(f"A100 calibration ({payload['report']['op_rows']} op rows) written to {CALIBRATION_PATH}")
    print(f"{'family':20s} {'interleaved %':>14s} {'leave-model-out %':>18s}")
    for family in report["interleaved"]:
        print(f"{family:20s} {report['interleaved'][family]:14.1f} {report['leave_one_model_out'][family]:18.1f}")
    print(json.dumps({"a100_median_ape_percent": report["interleaved"]}))


if __name__ == "__main__":
    _main()
