"""`solm diff`, `solm export`, `solm dashboard` as a user meets them: human summary then one JSON line,
one clear error line on bad input."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.cli import solm
from tests.dashboard.traces import make_trace


def _one_error_line(r: subprocess.CompletedProcess, command: str, needle: str) -> None:
    assert r.returncode == 2, r.stdout + r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"solm {command}: error:") and needle in err[0], r.stderr
    assert "Traceback" not in r.stderr


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    return (
        make_trace(d / "seq", e2e_s=[1.0, 3.0], passes=8),
        make_trace(d / "par", e2e_s=[0.5, 1.5], threads=[1, 1], system="pasta", passes=4),
    )


def test_diff_with_itself_json(pair):
    r = solm("diff", str(pair[0]), str(pair[0]), "--json")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1
    s = json.loads(lines[-1])
    assert s["identical"] is True and s["overall"]["speedup"] == 1.0
    assert all(m["delta"] in (0.0, None) for m in s["overall"]["metrics"].values())


def test_identical_says_of_which_requests(pair, tmp_path):
    """A trace against itself is identical; against itself less a request, the matched requests
    are (was: "identical" whole, the request only in A named on the line before)."""
    r = solm("diff", str(pair[0]), str(pair[0]))
    assert r.returncode == 0 and "\nidentical: zero deltas, same outputs, same dependence graphs\n" in r.stdout
    part = make_trace(tmp_path / "part", e2e_s=[1.0], passes=8)
    r = solm("diff", str(pair[0]), str(part))
    assert r.returncode == 0, r.stderr
    assert "matched 1 requests by request_id; unmatched: 1 only in A, 0 only in B\n" in r.stdout
    assert "\nthe matched requests are identical: zero deltas" in r.stdout


def test_diff_human_then_json_and_html(pair, tmp_path):
    html = tmp_path / "report.html"
    r = solm("diff", str(pair[0]), str(pair[1]), "--html", str(html))
    assert r.returncode == 0, r.stderr
    assert "speedup A/B  2.000x" in r.stdout and "graphs" in r.stdout
    s = json.loads(r.stdout.strip().splitlines()[-1])
    assert s["overall"]["speedup"] == pytest.approx(2.0) and s["html"] == str(html)
    page = html.read_text()
    assert page.startswith("<!doctype html>") and "plotly" in page.lower() and "dependence graph" in page


def test_diff_refuses_clearly(pair, tmp_path):
    v2 = make_trace(tmp_path / "v2", e2e_s=[1.0], schema_version=2)
    _one_error_line(solm("diff", str(pair[0]), str(v2)), "diff", "different schema versions")
    other = make_trace(tmp_path / "other", e2e_s=[1.0], prompts=("unrelated",))
    _one_error_line(solm("diff", str(pair[0]), str(other)), "diff", "no requests in common")
    _one_error_line(solm("diff", str(pair[0]), str(tmp_path / "missing")), "diff", "no such directory")


def test_export_perfetto(pair, tmp_path):
    out = tmp_path / "both.json"
    r = solm("export", str(pair[0]), str(pair[1]), "--perfetto", str(out))
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout.strip().splitlines()[-1])
    assert s["events"] == len(json.loads(out.read_text())["traceEvents"]) and s["counter_events"] > 0
    _one_error_line(
        solm("export", str(pair[0]), "--perfetto", str(tmp_path / "no" / "x.json")), "export", "no such directory"
    )


def test_dashboard_dry_run(pair, tmp_path):
    r = solm("dashboard", str(pair[0].parent), "--port", "8599", "--dry-run")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout.strip().splitlines()[-1])
    cmd = " ".join(s["command"])
    assert s["url"] == "http://127.0.0.1:8599" and "--server.headless true" in cmd
    assert "--browser.gatherUsageStats false" in cmd and "--server.address 127.0.0.1" in cmd
    assert cmd.endswith(str(pair[0].parent))
    _one_error_line(solm("dashboard", str(tmp_path / "nope")), "dashboard", "no such directory")


def test_measured_against_its_simulated_replay(pair, tmp_path):
    sim = tmp_path / "sim"
    r = solm("simulate", str(pair[0]), "--hardware", "h100-sxm", "--out", str(sim), "--json")
    assert r.returncode == 0, r.stderr
    r = solm("diff", str(pair[0]), str(sim), "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout.strip().splitlines()[-1])
    assert s["b"]["kind"] == "simulated" and s["matched"] == 2
    # the replay keeps the structure: same passes, outputs and graphs; only the time changes
    assert s["overall"]["metrics"]["steps"]["delta"] == 0 and s["overall"]["graph_identical_requests"] == 2
    total_a = s["overall"]["e2e_s_total_a"]
    assert s["overall"]["speedup"] == pytest.approx(total_a / s["overall"]["e2e_s_total_b"]) and total_a == 4.0
    r = solm("export", str(pair[0]), str(sim), "--perfetto", str(tmp_path / "side.json"), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["requests"] == 4
