"""The dashboard in a real browser: `solm dashboard` serves on 127.0.0.1, headless Debian chromium
(driven by Playwright, no browser download) waits for the Pareto chart of the What-if page,
changes the hardware, checks the chart redrew with other numbers, and saves a screenshot."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from profiler.services import die_with_parent

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
CHART_X = """() => {
    const g = document.querySelector('.st-key-whatif_pareto .js-plotly-plot');
    return g && g.data ? JSON.stringify(g.data.map(t => t.x)) : null;
}"""

if not os.path.exists(CHROMIUM):
    pytest.skip(f"{CHROMIUM} is absent (apt-get install chromium; .ci/run installs it)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def server(trace_folder, tmp_path):
    port = _free_port()
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "solm", "dashboard", str(trace_folder), "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=die_with_parent,  # never outlives a test run that is killed
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"dashboard did not start: {(tmp_path / 'server.log').read_text()[-2000:]}")
        time.sleep(0.5)
    yield url
    os.killpg(proc.pid, signal.SIGTERM)  # the solm process and its streamlit child, nothing else
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    log.close()


def test_whatif_control_redraws_pareto(server, tmp_path):
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{server}/whatif")
            page.wait_for_function(CHART_X, timeout=60_000)
            before = page.evaluate(CHART_X)
            assert json.loads(before), "the Pareto chart has no points"
            page.locator(".st-key-whatif_hardware").click()
            page.get_by_role("option", name="l4", exact=True).click()
            page.wait_for_function(
                f"() => ({CHART_X})() !== null && ({CHART_X})() !== {json.dumps(before)}", timeout=60_000
            )
            after = page.evaluate(CHART_X)
            assert after != before
            page.wait_for_timeout(500)
            shot = tmp_path / "whatif.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
            title = page.evaluate(
                "() => document.querySelector('.st-key-whatif_pareto .js-plotly-plot').layout.title.text"
            )
            assert "measured and on l4" in title, title
        finally:
            browser.close()
    if os.environ.get("SOLM_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["SOLM_KEEP_SCREENSHOT"])
