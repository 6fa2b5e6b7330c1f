"""Every dashboard page runs without exceptions under `streamlit.testing.v1.AppTest`, on a folder
holding measured and simulated traces and one corrupt trace (an error row; the others load)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from profiler.diff import diff_paths  # noqa: E402

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")
PAGES = ("pareto", "timeline", "graph", "whatif", "diff")


def _ok(at: AppTest, title: str) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert [t.value for t in at.title] == [title]


def test_overview_shows_traces_and_one_error_row(app):
    _ok(app, "Traces")
    assert [c.value for c in app.sidebar.caption] == ["3 trace(s) loaded, 1 unreadable"]
    table = app.dataframe[0].value
    assert table["status"].tolist().count("error") == 1 and table["status"].tolist().count("ok") == 3
    assert len(app.error) == 1 and "broken" in app.error[0].value
    assert {m.label: m.value for m in app.metric} == {"measured": "2", "simulated": "1", "unreadable": "1"}


def test_every_page_runs(app):
    titles = {
        "pareto": "Pareto: quality vs latency and memory",
        "timeline": "Timeline",
        "graph": "Dependence graph",
        "whatif": "What-if",
        "diff": "Diff",
    }
    charts = {"pareto": 2, "timeline": 3, "graph": 1, "whatif": 3, "diff": 2}
    for page in PAGES:
        app.switch_page(f"views/{page}.py").run()
        _ok(app, titles[page])
        assert len(app.get("plotly_chart")) == charts[page], page
        assert not app.error, (page, [e.value for e in app.error])
        if page == "pareto":  # 3 traces and 2 sweep configurations
            assert len(app.dataframe[0].value) == 5


def test_whatif_control_changes_the_simulation(app):
    app.switch_page("views/whatif.py").run()
    before = app.dataframe[0].value.copy()
    app.selectbox(key="whatif_hardware").set_value("l4").run()
    _ok(app, "What-if")
    after = app.dataframe[0].value
    assert not before.equals(after)


def test_diff_page_pairs_two_traces(app):
    app.switch_page("views/diff.py").run()
    app.selectbox(key="diff_a").set_value(0).run()
    app.selectbox(key="diff_b").set_value(0).run()
    _ok(app, "Diff")
    assert app.metric[0].value == "1.00x"


def test_whatif_deployment_controls_show_gpus_and_memory(app):
    app.switch_page("views/whatif.py").run()
    app.selectbox(key="whatif_model").set_value("llama-3-70b")
    app.selectbox(key="whatif_hardware").set_value("h100-sxm").run()
    assert app.error  # 70B on one 80 GB part: the clear memory error
    app.selectbox(key="whatif_tp").set_value(4)
    app.number_input(key="whatif_replicas").set_value(2).run()
    _ok(app, "What-if")
    assert not app.error, [e.value for e in app.error]
    metrics = {m.label: m.value for m in app.metric}
    assert metrics["GPUs"] == "8" and metrics["weights per GPU"].endswith("GiB")
    assert float(metrics["KV pool per GPU"].split()[0]) > 0
    app.selectbox(key="whatif_workload").set_value("splitwise_code")
    app.number_input(key="whatif_num_requests").set_value(50)
    app.number_input(key="whatif_slo_ttft").set_value(1000.0).run()
    _ok(app, "What-if")
    assert not app.error, [e.value for e in app.error]
    assert {m.label: m.value for m in app.metric}["goodput"].endswith("req/s")
    app.selectbox(key="whatif_pp").set_value(2)
    app.selectbox(key="whatif_pp_schedule").set_value("interleave").run()  # batches in flight in each replica
    _ok(app, "What-if")
    assert not app.error, [e.value for e in app.error]
    assert {m.label: m.value for m in app.metric}["GPUs"] == "16"


def test_diff_page_reads_the_token_texts_it_shows(app, trace_folder):
    """The traces are loaded without their per-token rows; the Diff page reads them, so outputs
    that differ are not counted identical (its token diff shows the texts)."""
    app.switch_page("views/diff.py").run()
    labels = app.selectbox(key="diff_a").options
    index = {name: next(i for i, lab in enumerate(labels) if lab.endswith(f"· {name}")) for name in ("seq", "pasta")}
    app.selectbox(key="diff_a").set_value(index["seq"])
    app.selectbox(key="diff_b").set_value(index["pasta"]).run()
    _ok(app, "Diff")
    want = diff_paths(trace_folder / "seq", trace_folder / "pasta").overall["text_identical_requests"]
    metrics = {m.label: m.value for m in app.metric}
    assert metrics["identical outputs"] == str(want) and want < int(metrics["matched requests"])
    ops = app.dataframe[2].value  # the token diff of the first request: its text
    assert ops["op"].tolist() == ["equal"] and len(ops["a"].iloc[0]) == 12


def test_whatif_gemm_calibration_changes_the_simulation(app, tmp_path):
    """A CAL.json (as `solm calibrate` writes it) for the chosen part re-times its GEMMs; a bad file or
    another kernel family's is one error line on the page."""
    import json

    from simulator.gemm import GemmParams

    cal = tmp_path / "h100.json"
    params = {**GemmParams().to_json(), "tensor_eff": 0.3, "memory_eff": 0.3}
    cal.write_text(
        json.dumps({"format": "solm-gemm-calibration", "version": 1, "hardware": "h100-sxm", "params": params})
    )
    app.switch_page("views/whatif.py").run()
    app.selectbox(key="whatif_model").set_value("llama-3-8b")
    app.selectbox(key="whatif_hardware").set_value("h100-sxm").run()
    before = app.dataframe[0].value.copy()
    app.text_input(key="whatif_gemm_calibration").set_value(str(cal)).run()
    _ok(app, "What-if")
    assert not app.error, [e.value for e in app.error]
    after = app.dataframe[0].value
    assert (after["mean_e2el_ms"] > before["mean_e2el_ms"]).all()  # a third of the efficiency: slower
    app.selectbox(key="whatif_hardware").set_value("a100-80g").run()  # Ampere: not the calibration's family
    assert app.error and "fitted on h100-sxm (hopper)" in app.error[0].value
    app.text_input(key="whatif_gemm_calibration").set_value(str(tmp_path / "absent.json")).run()
    assert app.error and "does not exist" in app.error[0].value
    assert not app.exception
