"""The Load page: measured and simulated latency-vs-throughput points per system; its frames."""

from __future__ import annotations

import pytest

from dashboard import load_data, load_figures
from profiler.reader import read_trace
from tests.simulator.test_load_validation import TRUTH, _requests, serving_trace, write_toy_trace

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from tests.dashboard.test_app import APP  # noqa: E402


@pytest.fixture(scope="module")
def load_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("load")
    reqs, prompts = _requests(8, "seq")
    write_toy_trace(root / "b1", reqs, prompts, timed_by=TRUTH, system="seq")
    for rate in (20.0, 400.0):
        serving_trace(root / f"seq-r{rate:g}", "seq", rate=rate, n=12)
    return root


def test_points_and_calibration_groups(load_folder):
    traces = [read_trace(load_folder / name) for name in ("b1", "seq-r20", "seq-r400")]
    points = load_data.load_points(traces)
    assert sorted(points["load"]) == ["rate 20/s", "rate 400/s"] and (points["kind"] == "measured").all()
    assert (points["e2e_ms_p50"] > 0).all() and (points["request_throughput"] > 0).all()
    ((calib, serving),) = load_data.calibration_groups(traces)
    assert calib.endswith("b1") and [s.split("/")[-1] for s in serving] == ["seq-r20", "seq-r400"]
    fig = load_figures.load_curve_figure(points)
    assert [t.name for t in fig.data] == ["seq measured"] and len(fig.data[0].x) == 2


def test_load_page_overlays_measured_and_simulated(load_folder, monkeypatch):
    monkeypatch.setenv("SOLM_TRACE_DIRS", str(load_folder))
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.switch_page("views/load.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert [t.value for t in at.title] == ["Load"] and len(at.get("plotly_chart")) == 1
    table = at.dataframe[0].value
    assert sorted(table["kind"].unique()) == ["measured", "simulated (batch-1 calibration)"] and len(table) == 4
    at.number_input(key="load_rate").set_value(50.0).run()  # what-if: every serving run's requests at 50/s
    table = at.dataframe[0].value
    assert not at.exception and sorted(table.loc[table["kind"] == "what-if", "load"]) == ["rate 50/s"] * 2


def test_whatif_replays_a_serving_trace_at_another_rate(load_folder, monkeypatch):
    monkeypatch.setenv("SOLM_TRACE_DIRS", str(load_folder))
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.switch_page("views/whatif.py").run()
    assert not at.exception and any("Serving runs" in c.value for c in at.caption)
    own = at.dataframe[0].value.set_index("trace")["duration_s"]
    at.number_input(key="whatif_rate").set_value(2.0).run()
    slow = at.dataframe[0].value.set_index("trace")["duration_s"]
    assert not at.exception and (slow.filter(like="seq-r") > 2 * own.filter(like="seq-r")).all()
