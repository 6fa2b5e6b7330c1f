"""The one geomean and the one Pareto filter every layer uses (profiler.stats)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dashboard.data import pareto_front
from profiler.stats import geomean, non_dominated


def test_geomean_skips_what_is_not_a_finite_positive_ratio():
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean([2.0, 8.0, float("nan"), None, 0.0, -3.0, math.inf, -math.inf]) == pytest.approx(4.0)
    assert geomean(pd.Series([1.0, 100.0, np.nan])) == pytest.approx(10.0)
    assert math.isnan(geomean([])) and math.isnan(geomean([0.0, float("nan"), math.inf]))


def test_non_dominated():
    x = np.array([[1.0, 1.0], [2.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.5, 0.9]])
    assert non_dominated(x).tolist() == [True, True, False, True, False]  # identical rows both kept
    # NaN is the worst value: optimal only where nothing beats it on the other columns
    assert non_dominated(np.array([[np.nan, 5.0], [1.0, 1.0], [np.nan, 0.0]])).tolist() == [True, True, False]
    assert non_dominated(np.zeros((0, 3))).tolist() == []
    with pytest.raises(ValueError, match=r"\(n, k\)"):
        non_dominated(np.zeros(3))


def test_dashboard_front_lower_x_higher_y():
    df = pd.DataFrame({"x": [1.0, 2.0, 2.0, 3.0, 1.0, np.nan], "y": [0.5, 0.9, 0.9, 0.8, 0.4, 1.0]})
    front = pareto_front(df, "x", "y")
    assert front.index.tolist() == [0, 1]  # the duplicate of row 1, the dominated and the NaN rows go
