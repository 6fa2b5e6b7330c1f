"""The sweep's Ray backend: every socket of a local Ray on loopback (checked with `ss`), no session
folder left behind, a wrong --address is one line and exit 2, and SIGTERM leaves no Ray process."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from profiler.services import die_with_parent, is_loopback
from simulator.ray_backend import parse_address, probe
from simulator.sweep import sweep
from tests.processes import descendants, ss_listeners, wait_for, wait_gone
from tests.simulator.toy_traces import seq, write_toy_trace

ROOT = Path(__file__).resolve().parents[2]
needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed")
# Ray 2.60 sockets that cannot be bound to loopback: none (see simulator/ray_backend.py).
KNOWN_EXCEPTIONS: set[str] = set()


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return str(write_toy_trace(tmp_path_factory.mktemp("ray") / "seq", [seq(8, 12)] * 2, [8] * 2, quality=[1.0] * 2))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when this returns: nothing listens there


def test_address_parsing_and_loopback():
    assert parse_address("127.0.0.1:6379") == ("127.0.0.1", 6379)
    assert parse_address("ray://head.local:10001") == ("head.local", 10001)
    assert parse_address("[::1]:6379") == ("::1", 6379)
    assert parse_address("auto") is None
    for bad in ("bogus", "127.0.0.1", "host:0", "host:99999", ":6379"):
        with pytest.raises(ValueError, match="not HOST:PORT"):
            parse_address(bad)
    assert all(map(is_loopback, ["127.0.0.1", "127.3.2.1", "::1", "::ffff:127.0.0.1", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "*", "::", "192.0.2.2", "::ffff:192.0.2.2"]))


def test_probe_refused_is_a_usage_error():
    with pytest.raises(ValueError, match=r"cannot reach a Ray cluster at 127\.0\.0\.1:\d+: .*refused"):
        probe(f"127.0.0.1:{_closed_port()}")


def test_cli_wrong_address_one_line_exit_2(trace):
    """The issue's hang (over 90 s at Ray's retry loop): now the connect timeout and one line."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "solm",
            "sweep",
            trace,
            "--hardware",
            "a100-80g",
            "--backend",
            "ray",
            "--address",
            f"127.0.0.1:{_closed_port()}",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("solm sweep: error: cannot reach a Ray cluster"), r.stderr


@needs_ray
def test_local_ray_listens_on_loopback_only_and_leaves_no_session(trace, capfd):
    import ray

    seen: dict = {}

    def look(done: int, total: int) -> None:  # while Ray is up: every socket of this process tree
        if "sockets" not in seen:
            pids = {os.getpid(), *descendants(os.getpid())}
            seen["sockets"] = [s for s in ss_listeners() if s[0] in pids]
            seen["session"] = ray._private.worker._global_node.get_session_dir_path()

    table = sweep([trace], ["a100-80g", "h100-sxm"], max_seqs=[1, 2], workers=2, backend="ray", progress=look)
    assert table["status"].eq("ok").all() and len(table) == 4
    names = {name for _, name, _, _ in seen["sockets"]}
    assert {"gcs_server", "raylet"} <= names, seen["sockets"]  # the check saw the Ray servers
    exposed = sorted({name for _, name, ip, _ in seen["sockets"] if not is_loopback(ip)})
    assert set(exposed) == KNOWN_EXCEPTIONS, seen["sockets"]
    assert "beyond loopback" not in capfd.readouterr().err  # and the backend's own check agreed
    session = Path(seen["session"])
    assert not session.exists() and not session.parent.exists()  # the temporary folder is gone
    assert not [p for p in Path("/tmp/ray").glob(f"session_*_{os.getpid()}")]
    assert not ray.is_initialized()


@needs_ray
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_signal_to_ray_sweep_leaves_no_process(trace, tmp_path, sig):
    """SIGTERM: the sweep shuts Ray down itself. SIGKILL: Ray's fate sharing ends gcs_server, raylet
    and workers, and the backend's watchdog the agents that outlive them, and the session folder."""
    cmd = [
        sys.executable,
        "-m",
        "solm",
        "sweep",
        trace,
        "--hardware",
        "a100-80g,h100-sxm,l4",
        "--max-seqs",
        ",".join(str(i) for i in range(1, 200)),
        "--backend",
        "ray",
        "--workers",
        "2",
        "--out",
        str(tmp_path / "o"),
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=die_with_parent,  # never outlives a test run that is killed
    )
    try:
        wait_for(lambda: (tmp_path / "o" / "results.jsonl").exists() or proc.poll() is not None, 120, "first rows")
        assert proc.poll() is None, proc.stderr.read().decode()
        kids = descendants(proc.pid)
        assert len(kids) >= 3, kids  # gcs_server, raylet, workers...
        temp = _temp_dirs(kids)
        assert temp, "no solm-ray-* session folder among the Ray command lines"
        proc.send_signal(sig)  # to the sweep alone, not its process group
        code = proc.wait(timeout=60)
        assert code == (128 + sig if sig == signal.SIGTERM else -sig), proc.stderr.read().decode()[-2000:]
        assert wait_gone(kids, 30) == set()
        wait_for(lambda: not [t for t in temp if t.exists()], 30, f"{temp} removed")
    finally:
        with contextlib.suppress(ProcessLookupError):  # its own session: nothing of the test's
            os.killpg(proc.pid, signal.SIGKILL)


def _temp_dirs(pids: set[int]) -> set[Path]:
    """The `solm-ray-*` folders the Ray processes were started with (from their command lines)."""
    import psutil

    out = set()
    for pid in pids:
        try:
            cmdline = " ".join(psutil.Process(pid).cmdline())
            out |= {Path(m) for m in re.findall(r"(/[^\s=]*/solm-ray-[^/\s]+)", cmdline)}
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out
