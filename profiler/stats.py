"""The two summaries every layer shares: the geometric mean of ratios and the Pareto filter.

One definition each, at the lowest layer, so `solm inspect`, `solm diff`, sweeps, the dashboard and
the bench scripts agree on what a "geomean speedup" and a "Pareto-optimal" row are.

- `geomean(xs)`: the geometric mean of the finite, positive values; NaN, None, +-inf, zero and
  negatives are skipped (a ratio that is undefined or degenerate says nothing about the typical
  ratio); NaN when nothing is left.
- `non_dominated(x)`: rows of an (n, k) array, every column to maximise, that no other row beats,
  i.e. is at least as good on every column and better on one. NaN counts as the worst value, so a
  row missing an objective is optimal only if nothing else is better there; identical rows do not
  dominate each other (both are kept).

    geomean([2.0, 8.0, float("nan")])                 # 4.0
    non_dominated(np.array([[1, 1], [2, 0], [0, 0]]))  # [True, True, False]
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np


def geomean(xs: Iterable[float | None]) -> float:
    """Geometric mean of the finite positive values (see the module docstring); NaN if none."""
    a = np.asarray([x for x in xs if x is not None and 0 < x < math.inf], dtype=float)
    return float(np.exp(np.log(a).mean())) if len(a) else float("nan")


def non_dominated(x: np.ndarray) -> np.ndarray:
    """(n,) bool: True where no other row of `x` (n, k), higher is better, dominates this one."""
    x = np.asarray(x, dtype=float)
    if x.ndim != 2:
        raise ValueError(f"non_dominated needs an (n, k) array, got shape {x.shape}")
    x = np.where(np.isnan(x), -np.inf, x)
    ge = (x[:, None, :] >= x[None, :, :]).all(-1)  # ge[i, j]: i at least as good as j everywhere
    gt = (x[:, None, :] > x[None, :, :]).any(-1)
    return np.asarray(~(ge & gt).any(0), dtype=bool)
