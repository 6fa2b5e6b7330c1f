"""The command line as a user meets it: one JSON line at the end, one clear error line on bad input."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.cli import solm

REQUIRED = {
    "requests",
    "output_tokens",
    "quality_mean",
    "tokens_per_s",
    "ttft_s_p50",
    "e2e_s_mean",
    "e2e_s_p50",
    "e2e_s_p99",
    "peak_kv_tokens",
    "peak_kv_bytes",
    "nvml",
}


def test_version_names_the_release_and_the_checkouts_commit(tmp_path, monkeypatch):
    """`solm --version`: one line, exit 0, with the commit a capture records in meta.json; outside
    a checkout (an installed package, perhaps inside someone else's repository) no commit."""
    from profiler import provenance

    out = solm("--version")
    assert out.returncode == 0 and out.stderr == ""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=provenance.REPO_ROOT, capture_output=True, text=True)
    assert out.stdout == f"solm {provenance.solm_version()} (commit {commit.stdout.strip()[:12]})\n"
    git = ["git", "-C", str(tmp_path), "-c", "user.name=u", "-c", "user.email=u@localhost"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "someone else's"], check=True)
    (tmp_path / "site-packages").mkdir()
    monkeypatch.setattr(provenance, "REPO_ROOT", tmp_path / "site-packages")  # inside that repository
    assert provenance.git_commit() == "" and provenance.version_line() == f"solm {provenance.solm_version()}"


def test_commands_that_read_traces_start_without_torch(small_trace):
    """Every command's parser is built at start: capture's list of systems imported the engines,
    and torch with them, for `solm inspect` and `--help` too (3.5 s of each start on this machine).
    The commands that read traces and model costs never load torch."""
    import sys

    probe = "import sys, solm.cli as c\ntry:\n    c.main(sys.argv[1:])\nfinally:\n    print('torch' in sys.modules)"
    for args in (
        ["capture", "--help"],
        ["inspect", str(small_trace), "--json"],
        ["cost", "--hardware", "h100-sxm", "--model", "llama-3-8b", "--tokens", "1", "--json"],
    ):
        r = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines()[-1] == "False", args


def test_registry_finds_modules_without_importing_their_packages(tmp_path, monkeypatch):
    """`available` lists the names whose module is in the build, found on disk: no package's
    __init__ runs (that was what imported torch), and a missing module or package is not listed."""
    import sys

    from runtime.registry import available

    pkg = tmp_path / "solm_probe_pkg" / "sub"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (pkg / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (pkg / "here.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    table = {
        "here": "solm_probe_pkg.sub.here:X",
        "module_missing": "solm_probe_pkg.sub.gone:X",
        "package_missing": "solm_probe_pkg.nope.here:X",
        "not_a_package": "solm_probe_pkg.sub.here.deeper:X",
        "top_missing": "solm_no_such_pkg.here:X",
    }
    assert available(table) == ["here"]
    assert "solm_probe_pkg" not in sys.modules


def test_inspect_json_fields(small_trace):
    r = solm("inspect", str(small_trace), "--json")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1
    s = json.loads(lines[0])
    assert REQUIRED <= set(s) and s["requests"] == 3 and s["nvml"] is False


def test_inspect_human_then_json(small_trace):
    r = solm("inspect", str(small_trace), "--validate")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.strip().splitlines()
    assert "requests" in r.stdout and json.loads(lines[-1])["valid"] is True


def _assert_one_line_error(r: subprocess.CompletedProcess, needle: str) -> None:
    assert r.returncode == 2
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("solm inspect: error:") and needle in err[0], r.stderr
    assert "Traceback" not in r.stderr


def test_inspect_missing_dir(tmp_path):
    _assert_one_line_error(solm("inspect", str(tmp_path / "nope")), "no such directory")


def test_inspect_truncated_parquet(small_trace, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(small_trace, bad)
    data = (bad / "steps.parquet").read_bytes()
    (bad / "steps.parquet").write_bytes(data[: len(data) // 2])
    _assert_one_line_error(solm("inspect", str(bad)), "unreadable Parquet")


def test_inspect_wrong_schema_version(small_trace, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(small_trace, bad)
    meta = json.loads((bad / "meta.json").read_text())
    meta["schema_version"] = 2
    (bad / "meta.json").write_text(json.dumps(meta))
    _assert_one_line_error(solm("inspect", str(bad)), "schema version 2")


def test_inspect_missing_column(small_trace, tmp_path):
    import shutil

    import pyarrow.parquet as pq

    bad = tmp_path / "bad"
    shutil.copytree(small_trace, bad)
    pq.write_table(pq.read_table(bad / "tokens.parquet").drop(["kv_slot"]), bad / "tokens.parquet")
    _assert_one_line_error(solm("inspect", str(bad)), "missing columns kv_slot")


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--system", "nope"], "unknown system"),
        (["--model", "no-such-model"], "neither a checkpoint"),
        (["--task", "nope", "--model", "tiny-2l"], "unknown task"),
        (["--n", "0", "--model", "tiny-2l"], "--n must be"),
        (["--repeats", "0", "--model", "tiny-2l"], "--repeats must be"),
        (["--keep", "max", "--model", "tiny-2l"], "invalid choice"),
        (["--device", "cuda", "--model", "tiny-2l"], "CUDA"),
    ],
)
def test_capture_bad_input(tmp_path, args, needle):
    r = solm("capture", *args, "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_capture_then_inspect_end_to_end(tmp_path):
    out = tmp_path / "cap"
    r = solm("capture", "--system", "sequential", "--n", "2", "--max-tokens", "40", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout.strip().splitlines()[-1])
    assert s["requests"] == 2 and s["quality_mean"] is not None
    r2 = solm("capture", "--system", "sequential", "--n", "2", "--out", str(out))
    assert r2.returncode == 2 and "--force" in r2.stderr


def test_capture_repeats_records_one_run_per_request(tmp_path):
    """--repeats 3: every request runs three times in interleaved rounds; the trace holds one run per
    request (the fastest, with its own steps and timings) and the spread in meta.json."""
    from profiler.reader import read_trace
    from profiler.validate import validate as trace_problems

    out = tmp_path / "rep"
    r = solm(
        "capture",
        "--system",
        "sequential",
        "--model",
        "tiny-2l",
        "--n",
        "3",
        "--max-tokens",
        "10",
        "--repeats",
        "3",
        "--out",
        str(out),
        "--json",
    )
    assert r.returncode == 0, r.stderr
    t = read_trace(out)
    assert sorted(t.requests["request_id"]) == [0, 1, 2]
    assert t.steps.groupby("request_id").size().tolist() == t.requests.sort_values("request_id")["steps"].tolist()
    rep = t.meta["repeats"]
    assert t.meta["runs_per_request"] == 3 and rep["runs_per_request"] == 3 and rep["diverged_runs"] == 0
    assert rep["recorded"] == "the min end-to-end latency run"
    assert 0 <= rep["e2e_spread_percent_median"] <= rep["e2e_spread_percent_max"]
    for _, req in t.requests.iterrows():  # a request's steps lie inside its own recorded run
        s = t.steps[t.steps["request_id"] == req["request_id"]]
        assert (
            s["start_s"].min() >= req["arrival_s"]
            and (s["start_s"] + s["duration_s"]).max() <= req["arrival_s"] + req["e2e_s"] + 1e-9
        )
    assert not trace_problems(out)


def test_inspect_figures_follow_their_definitions(tmp_path):
    """`solm inspect`'s figures (profiler.summary) on a trace with one failed request: latencies over
    the requests that did not fail, p99 the 99th percentile, the speedup a geometric mean, peaks maxima."""
    import dataclasses
    import statistics

    import numpy as np

    from profiler.reader import read_trace
    from profiler.summary import summarize
    from tests.dashboard.traces import make_trace

    path = make_trace(tmp_path / "t", e2e_s=[1.0, 2.0, 3.0, 6.0, 10.0], threads=[0, 1, 3, 0, 7], passes=4)
    trace = read_trace(path)
    req = trace.requests.copy()
    req.loc[req["e2e_s"] == 10.0, "status"] = "error"
    s = summarize(dataclasses.replace(trace, requests=req))
    assert s["requests"] == 5 and s["errors"] == 1
    assert s["tokens_per_s"] == pytest.approx(req["output_tokens"].sum() / 12.0)  # over the 1 + 2 + 3 + 6 s that ran
    assert s["ttft_s_p50"] == pytest.approx(2.5 / 4) and s["e2e_s_p50"] == pytest.approx(2.5)
    assert s["e2e_s_mean"] == pytest.approx(3.0) and s["e2e_s_p99"] == pytest.approx(np.percentile([1, 2, 3, 6], 99))
    assert s["theoretical_speedup_geomean"] == pytest.approx(statistics.geometric_mean([1, 2, 4, 1, 8]))
    assert s["peak_kv_tokens"] == req["peak_live_kv_tokens"].max() > req["peak_live_kv_tokens"].min()
