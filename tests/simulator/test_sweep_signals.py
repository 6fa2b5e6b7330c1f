"""`solm sweep` on its process pool: SIGTERM stops the workers and keeps the finished rows (exit
143); even SIGKILL, which no handler sees, leaves no worker behind (they ask Linux for SIGTERM when
their parent dies)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from profiler.services import die_with_parent
from tests.processes import descendants, wait_for, wait_gone
from tests.simulator.toy_traces import seq, write_toy_trace

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return str(write_toy_trace(tmp_path_factory.mktemp("sig") / "seq", [seq(8, 12)] * 2, [8] * 2, quality=[1.0] * 2))


def _start(trace: str, out: Path) -> subprocess.Popen:
    # 3 x 400 configurations: minutes of work on 2 workers, so the pool is busy when the signal comes
    cmd = [
        sys.executable,
        "-m",
        "solm",
        "sweep",
        trace,
        "--hardware",
        "a100-80g,h100-sxm,l4",
        "--max-seqs",
        ",".join(str(i) for i in range(1, 401)),
        "--workers",
        "2",
        "--out",
        str(out),
    ]
    return subprocess.Popen(
        cmd,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=die_with_parent,  # never outlives a test run that is killed
    )


def _running(proc: subprocess.Popen, out: Path) -> set[int]:
    """Wait for the first finished rows; return the pool workers."""
    wait_for(lambda: (out / "results.jsonl").exists() or proc.poll() is not None, 120, "the first rows")
    assert proc.poll() is None, proc.stderr.read().decode()
    workers = descendants(proc.pid)
    assert len(workers) >= 2, workers
    return workers


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="signals and prctl as on Linux")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_signal_to_sweep_leaves_no_worker(trace, tmp_path, sig):
    out = tmp_path / "out"
    proc = _start(trace, out)
    try:
        workers = _running(proc, out)
        proc.send_signal(sig)  # to the sweep alone, not its process group
        code = proc.wait(timeout=60)
        assert wait_gone(workers, 30) == set(), f"orphaned workers after {sig.name}"
        if sig == signal.SIGTERM:
            assert code == 128 + signal.SIGTERM, proc.stderr.read().decode()
            rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
            assert 0 < len(rows) < 1200 and (out / "sweep.parquet").exists()  # what finished is kept
        else:
            assert code == -signal.SIGKILL
    finally:
        with contextlib.suppress(ProcessLookupError):  # its own session: nothing of the test's
            os.killpg(proc.pid, signal.SIGKILL)
