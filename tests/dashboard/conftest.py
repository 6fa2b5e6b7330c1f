"""A folder of traces for the dashboard tests: measured sequential and PASTA-shaped, a simulated one,
and one corrupt trace that must show as an error row while the others load."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.dashboard.traces import make_trace


@pytest.fixture(scope="session")
def trace_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("dash")
    make_trace(root / "seq", e2e_s=[0.4, 0.6, 0.5], passes=12, quality=0.6, counters="nvml")
    make_trace(root / "pasta", e2e_s=[0.2, 0.3, 0.2], threads=[2, 2, 1], system="pasta", passes=4, quality=0.55)
    make_trace(
        root / "sim" / "seq-h100", e2e_s=[0.01, 0.02, 0.01], kind="simulated", passes=12, quality=0.6, counters=None
    )
    sweep = root / "sweep1"  # a `solm sweep --out` folder: its table, not a trace
    sweep.mkdir()
    pd.DataFrame(
        {
            "trace": [str(root / "seq")] * 2 + [str(root / "pasta")],
            "system": ["sequential"] * 2 + ["pasta"],
            "hardware": ["a100-80g", "h100-sxm", "h100-sxm"],
            "model": "tiny-2l",
            "max_seqs": [8, 8, 8],
            "rate": [None, None, None],
            "status": ["ok", "ok", "error"],
            "quality_mean": [0.6, 0.6, None],
            "mean_e2el_ms": [12.0, 9.0, None],
            "median_e2el_ms": [11.0, 8.0, None],
            "median_ttft_ms": [1.0, 0.8, None],
            "output_throughput": [900.0, 1200.0, None],
            "peak_kv_bytes": [4096, 4096, None],
            "pareto": [False, True, False],
        }
    ).to_parquet(sweep / "sweep.parquet")
    bad = root / "broken"
    bad.mkdir()
    (bad / "meta.json").write_text('{"schema_version": 1, "kind": "measured"')  # cut short
    return root


@pytest.fixture()
def app(trace_folder, monkeypatch):
    """The dashboard run in-process (Streamlit's AppTest, no server) on `trace_folder`."""
    from streamlit.testing.v1 import AppTest

    from tests.dashboard.test_app import APP

    monkeypatch.setenv("SOLM_TRACE_DIRS", str(trace_folder))
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    return at
