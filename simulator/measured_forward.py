"""A forward pass on a CPU as it was measured: the rows sweep's grid, or a line through the passes.

Why: on a CPU a small model's forward is dominated by the framework's per-op dispatch (about 2 ms
for the shipped tiny models whatever the rows), and its growth is not a GPU's roofline: one row
runs a matrix-vector kernel and two rows already pay a GEMM's packing, so the shipped tiny models'
forward steps by ~0.3 ms from 1 to 2 rows and then grows a few tens of microseconds a row; the keys
cost per slot of the span a row sees (the pool's slots under the serving runtime's mask attention,
read once for all rows) plus per key scored. `CostModel`'s roofline rescaled by three factors
(`fit_cost_params_to_steps`) keeps the priors' curve shape: fitted on a batch-1 trace plus the
rows sweep it predicted a 1-row decode ~10% slower than it ran and passes of 3-8 rows faster
(docs/serving.md, section 4). So on a CPU the calibration takes the measurement itself, as Vidur
profiles its operators on a grid and interpolates:

- `SweepForward.fit(sweep, passes)`: the rows sweep (`runtime/rows_sweep.py`: decode passes of
  1-32 rows over pools of 64-1024 slots) gives per row count a line over the span (fixed + per
  slot, each >= 0, soft-L1 so one timing spike is not a trend); between row counts both are
  interpolated linearly, beyond the largest extrapolated along the last two (never falling); both
  are made non-decreasing in rows (more rows never run faster). The sweep times decode rows in a
  tight loop, where a server's pass runs after its host work has cooled the caches: two factors,
  the median over the calibration's own passes (timed alone, `steps.forward_s`) of measured over
  the grid's prediction, carry the grid to a server's passes, one for decode passes (a row per
  stream) and one for passes with a multi-row stream (a prefill, a denoise span), whose rows
  differ from decode rows (causal visibility, one KV write each). Medians over passes, not over
  pass sizes: a TIP calibration has two prefill sizes, one of them the process's first pass (35%
  slower than the rest, a warm-up), and a median of two is their mean.
- `LineForward.fit(passes)`: where a trace has no rows sweep, `fixed + per_row * rows + per_span
  * keys / rows + per_key * keys` (each >= 0) fitted on its passes.

Both answer `step_time_s` as `CostModel` does (floats or arrays), so a replay takes them in its
place (`load_calibration.HostCost.forward`). `keys / rows` is the span a row sees: under mask
attention the pool's slots, with per-request gathers the mean visible KV.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy.optimize import least_squares

from profiler.errors import UsageError

Number = float | np.ndarray


def _robust_nonneg(design: np.ndarray, y: np.ndarray, x_scale: np.ndarray) -> np.ndarray:
    """Coefficients >= 0 of `design @ x ~ y` by relative error with a soft-L1 loss."""
    x0 = np.zeros(design.shape[1])
    x0[0] = float(np.min(y))
    res = least_squares(
        lambda x: design @ x / y - 1.0, x0, bounds=(0.0, np.inf), loss="soft_l1", f_scale=0.05, x_scale=x_scale
    )
    return res.x


def _timed(passes: np.ndarray) -> np.ndarray:
    """The rows (query tokens, keys, seconds, ...) of passes with rows and a finite positive time."""
    p = np.atleast_2d(np.asarray(passes, float))
    if p.shape[1] < 3:
        return np.zeros((0, 3))
    return p[(p[:, 0] > 0) & (p[:, 2] > 0) & np.isfinite(p[:, 2])]


@dataclasses.dataclass(frozen=True)
class LineForward:
    fixed_s: float
    per_row_s: float
    per_span_s: float
    per_key_s: float
    source: str = "line"

    @classmethod
    def fit(cls, passes: np.ndarray, source: str = "") -> LineForward:
        """Fit on rows (query tokens, keys scored, forward seconds[, ...]): see the module docstring."""
        p = _timed(passes)
        if len(p) < 4:
            raise UsageError(f"a line forward needs >= 4 timed passes, got {len(p)}")
        q, kv = p[:, 0], p[:, 1]
        design = np.column_stack([np.ones_like(q), q, kv / q, kv])
        a, b, c, d = _robust_nonneg(design, p[:, 2], np.array([float(np.median(p[:, 2])), 1e-5, 1e-7, 1e-8]))
        return cls(float(a), float(b), float(c), float(d), source or f"line fitted to {len(p)} passes")

    def step_time_s(
        self, query_tokens: Number, kv_tokens_read: Number, query_groups: Number = 1, logit_tokens: Number | None = None
    ) -> Number:
        if isinstance(query_tokens, np.ndarray) or isinstance(kv_tokens_read, np.ndarray):
            qa, kva = np.asarray(query_tokens, float), np.asarray(kv_tokens_read, float)
            return (
                self.fixed_s + self.per_row_s * qa + self.per_span_s * kva / np.maximum(qa, 1.0) + self.per_key_s * kva
            )
        q, kv = float(query_tokens), float(kv_tokens_read)
        return self.fixed_s + self.per_row_s * q + self.per_span_s * kv / max(q, 1.0) + self.per_key_s * kv

    def describe(self) -> str:
        return (
            f"{self.fixed_s * 1e3:.3f} ms + {self.per_row_s * 1e6:.2f} us/row + {self.per_span_s * 1e6:.3f} us/slot"
            f" + {self.per_key_s * 1e9:.1f} ns/key"
        )


@dataclasses.dataclass(frozen=True)
class SweepForward:
    rows: tuple[float, ...]  # the sweep's row counts, ascending
    fixed_s: tuple[float, ...]  # per row count: seconds at a span of 0 slots
    per_slot_s: tuple[float, ...]  # per row count: seconds per slot of the span
    scale: float = 1.0  # a server's decode pass over the sweep's tight loop (the calibration's own)
    prefill_scale: float = 1.0  # the same for a pass with a multi-row stream
    source: str = "rows sweep"

    @classmethod
    def fit(cls, sweep: np.ndarray, passes: np.ndarray | None = None, source: str = "") -> SweepForward:
        """Per row count of `sweep` (rows, keys, seconds[, ...]) a line over the span; `passes` (the
        calibration's own: rows, keys, forward seconds, streams) set the two scales. See the module
        docstring."""
        s = _timed(sweep)
        counts = np.unique(s[:, 0])
        if len(counts) < 2:
            raise UsageError(f"a rows sweep needs >= 2 row counts, got {len(counts)}")
        fixed, per_slot = [], []
        for r in counts:
            m = s[:, 0] == r
            span, y = s[m, 1] / r, s[m, 2]
            if len(y) >= 2 and np.ptp(span) > 0:
                a, b = _robust_nonneg(
                    np.column_stack([np.ones_like(span), span]), y, np.array([float(np.median(y)), 1e-7])
                )
            else:
                a, b = float(np.median(y)), 0.0
            fixed.append(float(a))
            per_slot.append(float(b))
        grid = cls(
            tuple(float(r) for r in counts),
            tuple(np.maximum.accumulate(fixed).tolist()),
            tuple(np.maximum.accumulate(per_slot).tolist()),
        )
        p = _timed(passes) if passes is not None else np.zeros((0, 4))
        ratio = p[:, 2] / np.asarray(grid.step_time_s(p[:, 0], p[:, 1]), float) if len(p) else np.zeros(0)
        multi = p[:, 0] > (p[:, 3] if p.shape[1] > 3 else 1.0)
        scales = [float(np.median(ratio[m])) if m.any() else np.nan for m in (~multi, multi)]
        decode, prefill = (np.nan_to_num(x, nan=np.nan_to_num(y, nan=1.0)) for x, y in (scales, scales[::-1]))
        return dataclasses.replace(
            grid,
            scale=float(decode),
            prefill_scale=float(prefill),
            source=source or f"rows sweep ({len(s)} passes) carried by {len(p)} own passes",
        )

    def _at(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows, fixed, slot = (np.asarray(v, float) for v in (self.rows, self.fixed_s, self.per_slot_s))
        a, b = np.interp(q, rows, fixed), np.interp(q, rows, slot)
        beyond = q > rows[-1]
        if beyond.any():  # along the last two row counts, never falling
            d = np.maximum(q - rows[-1], 0.0) / (rows[-1] - rows[-2])
            a = np.where(beyond, fixed[-1] + d * max(fixed[-1] - fixed[-2], 0.0), a)
            b = np.where(beyond, slot[-1] + d * max(slot[-1] - slot[-2], 0.0), b)
        return a, b

    def step_time_s(
        self, query_tokens: Number, kv_tokens_read: Number, query_groups: Number = 1, logit_tokens: Number | None = None
    ) -> Number:
        scalar = not (isinstance(query_tokens, np.ndarray) or isinstance(kv_tokens_read, np.ndarray))
        q = np.maximum(np.atleast_1d(np.asarray(query_tokens, float)), 1.0)
        kv = np.atleast_1d(np.asarray(kv_tokens_read, float))
        a, b = self._at(q)
        multi = q > np.atleast_1d(np.asarray(query_groups, float))
        t = np.where(multi, self.prefill_scale, self.scale) * (a + b * kv / q)
        return float(t[0]) if scalar else t

    def describe(self) -> str:
        return (
            f"{len(self.rows)} row counts {int(self.rows[0])}-{int(self.rows[-1])}, x{self.scale:.3f} decode,"
            f" x{self.prefill_scale:.3f} multi-row"
        )
