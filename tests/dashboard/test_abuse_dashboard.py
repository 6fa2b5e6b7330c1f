"""Bad user data for the dashboard and `solm dashboard`: each bad item is one error line (or one
stderr line, exit 2, for the command), never a traceback, and the good traces keep loading."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from dashboard import data  # noqa: E402
from solm.cli import main  # noqa: E402
from tests.dashboard.traces import make_trace  # noqa: E402

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A good trace and one whose tokens.parquet is cut short (meta, requests and steps still read)."""
    root = tmp_path_factory.mktemp("abuse")
    make_trace(root / "good", e2e_s=[0.4, 0.6], passes=6)
    bad = make_trace(root / "cut", e2e_s=[0.3, 0.5], passes=6)
    data = (bad / "tokens.parquet").read_bytes()
    (bad / "tokens.parquet").write_bytes(data[: len(data) // 2])
    return root


def _app(root: Path, monkeypatch, page: str) -> AppTest:
    monkeypatch.setenv("SOLM_TRACE_DIRS", str(root))
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.switch_page(f"views/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_whatif_trace_unreadable_in_full_is_one_error_line(folder, monkeypatch):
    """The What-if page reads a chosen trace whole: a corrupt tokens.parquet was a TraceError traceback."""
    at = _app(folder, monkeypatch, "whatif")
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "cut/tokens.parquet: unreadable Parquet" in errors[0], errors
    assert len(at.dataframe[0].value) == 1  # the good trace still simulated


@pytest.mark.parametrize(
    "content, fault",
    [
        ('{"1": {"nodes": 5, "links": []}}', "graph 1: not node-link"),
        ('{"1": [1, 2]}', "graph 1: not node-link"),
        ('{"1": {"nodes": [{"id": "a"}], "links": [{"source": "a"}]}}', "graph 1: a link without source and target"),
    ],
)
def test_graph_json_of_the_wrong_shape_is_an_error_row(tmp_path, content, fault):
    """A graph that was not node-link lists loaded, then crashed the Diff page ('int' object is not
    iterable); now the trace is an error row saying what `solm diff` says of it."""
    make_trace(tmp_path / "good", e2e_s=[0.4, 0.6], passes=6)
    make_trace(tmp_path / "other", e2e_s=[0.3, 0.5], passes=6)
    (tmp_path / "other" / "graph.json").write_text(content)
    traces, errors = data.load_traces([tmp_path / "good", tmp_path / "other"])
    assert [t.name for t in traces] == ["good"]
    assert len(errors) == 1 and errors["error"][0].startswith(f"{tmp_path / 'other'}: not a valid trace: {fault}")


def test_graph_json_wrong_shape_is_an_error_row_and_diff_runs(tmp_path, monkeypatch):
    make_trace(tmp_path / "good", e2e_s=[0.4, 0.6], passes=6)
    make_trace(tmp_path / "other", e2e_s=[0.3, 0.5], passes=6)
    (tmp_path / "other" / "graph.json").write_text('{"1": {"nodes": 5}}')
    at = _app(tmp_path, monkeypatch, "overview")
    assert len(at.error) == 1 and "other: not a valid trace: graph 1: not node-link" in at.error[0].value
    at.switch_page("views/diff.py").run()
    assert not at.exception, [e.value for e in at.exception]


def _dashboard(capsys, *args: str) -> tuple[int, str]:
    rc = main(["dashboard", *args, "--dry-run"])
    return rc, capsys.readouterr().err


def test_dashboard_command_bad_dirs(tmp_path, capsys, monkeypatch):
    """A symlink loop was 'internal error (a bug): RuntimeError: Symlink loop', exit 1; a file said
    'no such directory'."""
    monkeypatch.chdir(tmp_path)
    os.symlink("loop", "loop")
    Path("afile").write_text("x")
    os.mkfifo("fifo")
    for name, what in (
        ("loop", "not a directory"),
        ("afile", "not a directory"),
        ("fifo", "not a directory"),
        ("gone", "no such directory"),
    ):
        rc, err = _dashboard(capsys, name)
        assert rc == 2 and err.count("\n") == 1 and f"{name}: {what}" in err, (name, err)


def test_whatif_disaggregate_beyond_int64_is_one_error_line(folder, monkeypatch):
    """'99999999999999999999:1' was an OverflowError traceback on the page (and exit 1 from
    `solm simulate --disaggregate`); 10^8 replicas hung. Now over MAX_REPLICAS is one line."""
    from simulator.cluster.run import MAX_REPLICAS

    at = _app(folder, monkeypatch, "whatif")
    at.multiselect(key="whatif_traces").set_value([str(folder / "good")])
    for value, count in (("99999999999999999999:1", "100000000000000000000"), (f"{MAX_REPLICAS}:1", MAX_REPLICAS + 1)):
        at.text_input(key="whatif_disaggregate").set_value(value).run()
        assert not at.exception, [e.value for e in at.exception]
        assert [e.value for e in at.error] == [
            f"sequential · measured · good: {count} replicas: at most {MAX_REPLICAS} (--replicas, or P + D of --disaggregate)"
        ]
    at.text_input(key="whatif_disaggregate").set_value("1:1").run()
    assert not at.exception and not at.error, [e.value for e in at.error]


def test_timeline_steps_unreadable_after_loading_is_one_error_line(tmp_path, monkeypatch):
    """The Timeline reads its steps columns when shown: a steps.parquet damaged after the traces
    loaded was a TraceError traceback on the page."""
    make_trace(tmp_path / "good", e2e_s=[0.4, 0.6], passes=6)
    at = _app(tmp_path, monkeypatch, "overview")
    (tmp_path / "good" / "steps.parquet").write_bytes(b"junk")
    at.switch_page("views/timeline.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert len(at.error) == 1 and "good/steps.parquet: unreadable Parquet" in at.error[0].value


def test_damaged_sweep_tables_are_one_error_line_each(tmp_path, monkeypatch):
    """A sweep.parquet whose figures were strings crashed the Pareto page (could not convert string
    to float); a cut-short one was left out without a word."""
    import pandas as pd

    make_trace(tmp_path / "good", e2e_s=[0.4, 0.6], passes=6)
    for name in ("cut", "strings"):
        (tmp_path / name).mkdir()
    (tmp_path / "cut" / "sweep.parquet").write_bytes(b"PAR1 cut short")
    figures = {"quality_mean": ["abc"], "mean_e2el_ms": ["x"], "peak_kv_bytes": [1]}
    pd.DataFrame({"hardware": ["h100-sxm"], "status": ["ok"], **figures}).to_parquet(
        tmp_path / "strings" / "sweep.parquet"
    )
    at = _app(tmp_path, monkeypatch, "pareto")
    cut, strings = sorted(e.value for e in at.error)
    assert cut.startswith(f"{tmp_path / 'cut' / 'sweep.parquet'}: not a solm sweep table: unreadable Parquet (")
    assert strings == (
        f"{tmp_path / 'strings' / 'sweep.parquet'}: not a solm sweep table: quality_mean, mean_e2el_ms not "
        "numbers; its configurations are not drawn"
    )
    assert len(at.dataframe[0].value) == 1  # the good trace drawn


def test_sweep_with_no_finished_configuration_is_one_error_line(tmp_path, monkeypatch):
    """A sweep.parquet whose every configuration failed crashed the Pareto page (TypeError:
    operation 'add' not supported for dtype 'str' with dtype 'int64', labelling no rows)."""
    import pandas as pd

    make_trace(tmp_path / "good", e2e_s=[0.4, 0.6], passes=6)
    (tmp_path / "failed").mkdir()
    figures = {"quality_mean": [float("nan")], "mean_e2el_ms": [float("nan")], "peak_kv_bytes": [float("nan")]}
    settings = {"system": ["tip"], "hardware": ["h100-sxm"], "model": ["llama-3-8b"], "max_seqs": [8], "rate": [1.0]}
    pd.DataFrame({**settings, "status": ["error"], **figures}).to_parquet(tmp_path / "failed" / "sweep.parquet")
    at = _app(tmp_path, monkeypatch, "pareto")
    assert not at.exception, [e.value for e in at.exception]
    assert [e.value for e in at.error] == [
        f"{tmp_path / 'failed' / 'sweep.parquet'}: no configuration of this sweep finished (see its "
        "results.jsonl); nothing to draw"
    ]
    assert len(at.dataframe[0].value) == 1  # the good trace drawn


def test_sidebar_folder_that_is_no_path_is_one_warning(folder, monkeypatch):
    """A NUL byte ('embedded null byte') or a name too long for the OS (Errno 36) typed in the
    sidebar crashed every page; now one warning line each while the good folder loads."""
    at = _app(folder, monkeypatch, "overview")
    long_name = str(folder / ("x" * 300))
    at.text_area(key="roots").set_value(f"{folder}\n{folder}/\x00\n{long_name}")
    for page in ("overview", "pareto", "whatif"):
        at.switch_page(f"views/{page}.py").run()
        assert not at.exception, (page, [e.value for e in at.exception])
        warnings = [w.value for w in at.sidebar.warning]
        assert len(warnings) == 2 and "NUL byte" in warnings[0] and "name too long" in warnings[1].lower(), warnings
    assert [c.value for c in at.sidebar.caption] == ["2 trace(s) loaded"]
