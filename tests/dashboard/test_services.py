"""`solm dashboard` as a service: it listens on 127.0.0.1 only (checked with `ss`), its Streamlit
server dies with it (SIGTERM and SIGKILL), an address beyond loopback gets a warning line, the
toolbar has no Deploy button, and the sidebar opens only the folders given on the command line."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from profiler.services import die_with_parent, is_loopback
from solm.commands.dashboard import command
from tests.dashboard.traces import make_trace
from tests.processes import descendants, ss_listeners, wait_for, wait_gone

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "dashboard" / "app.py")
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _solm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "solm", "dashboard", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=ENV,
        timeout=120,
    )


def test_address_beyond_loopback_warns(tmp_path):
    quiet = _solm(str(tmp_path), "--dry-run")
    assert quiet.returncode == 0 and quiet.stderr == ""
    loud = _solm(str(tmp_path), "--address", "0.0.0.0", "--dry-run")
    assert loud.returncode == 0
    lines = loud.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("solm dashboard: warning: serving on 0.0.0.0, not loopback"), lines
    assert json.loads(loud.stdout.splitlines()[-1])["url"] == "http://0.0.0.0:8501"


def test_toolbar_has_no_deploy_button(tmp_path, monkeypatch):
    cmd = command([str(tmp_path)], 8501)
    assert cmd[cmd.index("--client.toolbarMode") + 1] == "viewer"  # viewer: no deploy, rerun, clear cache
    import streamlit

    monkeypatch.setenv("SOLM_TRACE_DIRS", str(tmp_path))
    streamlit.config.set_option("client.toolbarMode", "auto")
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception
    assert streamlit.config.get_option("client.toolbarMode") == "viewer"  # `streamlit run app.py` too


@pytest.fixture()
def fenced(tmp_path):
    """allowed/ (a trace, and a symlink to outside/) and outside/ (another trace)."""
    make_trace(tmp_path / "allowed" / "inside", e2e_s=[0.1, 0.2], passes=2)
    make_trace(tmp_path / "outside" / "secret", e2e_s=[0.1, 0.2], passes=2)
    (tmp_path / "allowed" / "link").symlink_to(tmp_path / "outside", target_is_directory=True)
    return tmp_path


def _app(root: Path, monkeypatch, any_path: bool) -> AppTest:
    monkeypatch.setenv("SOLM_TRACE_DIRS", str(root / "allowed"))
    monkeypatch.setenv("SOLM_ALLOW_ANY_PATH", "1" if any_path else "0")
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.sidebar.text_area[0].set_value(f"{root / 'allowed'}\n{root / 'outside'}\n/etc").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _loaded(at: AppTest) -> list[str]:
    return sorted(Path(p).name for p in at.dataframe[0].value["path"])


def test_sidebar_opens_only_the_given_folders(fenced, monkeypatch):
    at = _app(fenced, monkeypatch, any_path=False)
    refused = [w.value for w in at.sidebar.warning]
    assert len(refused) == 2 and refused[0].startswith(f"{fenced / 'outside'}: outside the folders given")
    assert refused[1].startswith("/etc: outside")
    assert at.sidebar.caption[0].value == "1 trace(s) loaded" and _loaded(at) == ["inside"]  # not via the symlink


def test_a_tilde_in_the_sidebar_is_judged_where_it_is_read(fenced, monkeypatch):
    """Was: `~/x` was checked as $HOME/x (inside the folders given) but read as ./~/x, so a trace
    outside them (here outside/~/x, the working directory outside/) loaded."""
    make_trace(fenced / "outside" / "~" / "x", e2e_s=[0.1, 0.2], passes=2)
    monkeypatch.setenv("HOME", str(fenced / "allowed"))
    monkeypatch.chdir(fenced / "outside")
    monkeypatch.setenv("SOLM_TRACE_DIRS", str(fenced / "allowed"))
    monkeypatch.setenv("SOLM_ALLOW_ANY_PATH", "0")
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.sidebar.text_area[0].set_value("~/x").run()
    assert not at.exception, [e.value for e in at.exception]
    assert [w.value.split(":")[0] for w in at.sidebar.warning] == ["~/x"]
    assert not at.dataframe or not len(at.dataframe[0].value)


def test_allow_any_path_opens_any_folder(fenced, monkeypatch):
    at = _app(fenced, monkeypatch, any_path=True)
    assert not at.sidebar.warning
    assert at.sidebar.caption[0].value == "2 trace(s) loaded" and _loaded(at) == ["inside", "secret"]


@pytest.fixture()
def server(tmp_path):
    make_trace(tmp_path / "t", e2e_s=[0.1, 0.2], passes=2)
    port = _free_port()
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "solm", "dashboard", str(tmp_path), "--port", str(port)],
        cwd=ROOT,
        env=ENV,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=die_with_parent,  # never outlives a test run that is killed
    )

    def healthy() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"dashboard exited: {(tmp_path / 'server.log').read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    try:
        wait_for(healthy, 90, "the dashboard's health check")
        yield proc, port
    finally:
        with contextlib.suppress(ProcessLookupError):  # its own session: nothing of the test's
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def test_listens_on_loopback_only(server):
    proc, port = server
    pids = {proc.pid, *descendants(proc.pid)}
    mine = [s for s in ss_listeners() if s[0] in pids]
    assert port in {p for *_, p in mine}, mine  # the check saw the server's socket
    assert all(is_loopback(ip) for _, _, ip, _ in mine), mine


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="signals and prctl as on Linux")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_streamlit_dies_with_solm_dashboard(server, sig):
    proc, _ = server
    children = descendants(proc.pid)
    assert children, "no streamlit child"
    proc.send_signal(sig)  # to solm alone, not its process group
    assert proc.wait(timeout=30) == (128 + sig if sig == signal.SIGTERM else -sig)
    assert wait_gone(children, 30) == set(), f"streamlit outlived solm dashboard after {sig.name}"
