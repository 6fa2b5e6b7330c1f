"""`solm dashboard` (solm/commands/dashboard.py), the sweep's Ray backend (simulator/ray_backend.py)
and counter sampling (profiler/counters.py): what a mutation round found unpinned. These tests
check the command line, environment and settings the code builds, with stand-ins for Streamlit's
process, Ray and NVML, so nothing here starts a server and nothing is sent beyond 127.0.0.1.

The round: 51 mutants (22 in dashboard.py: bind address, port, the server's lifetime, argument
checks, the Streamlit flags and environment; 16 in ray_backend.py: loopback settings, usage
statistics, the probe, cleanup; 13 in counters.py: units, the energy sum, the NVML fallback) run
against the fast tests of each (tests/cli/test_commands_mutants.py, tests/test_abuse_*.py,
tests/cli/test_diff_export_cli.py, tests/dashboard/test_services.py and test_abuse_dashboard.py,
tests/simulator/test_ray_backend.py and test_sweep.py's Ray case, tests/profiler/
test_counters_recorder.py, tests/runtime/test_capture_mutants.py): 31 killed there, the 20
survivors all killed here; none equivalent. Among them: every `solm dashboard` serving with any
folder allowed (SOLM_ALLOW_ANY_PATH always 1), the server's exit status lost, the local Ray's
node IP, usage statistics and loopback switch, a watchdog left running, the probe's 5 s limit.
Two bugs found through survivors, fixed: `--address local` started Ray's own local cluster (node IP on the
machine's outward address), and the energy integrated from power restarted at 0 after one failed
power reading (the cumulative column fell back).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import simulator.ray_backend as rb
import solm.commands.dashboard as dashboard
from profiler.counters import CounterSampler
from profiler.services import die_with_parent
from solm.cli import main
from tests.profiler.test_counters_recorder import FakeNVML


def refused(argv: list[str], capsys, needle: str) -> None:
    """`solm ARGV` is one line `solm <command>: error: ...` naming `needle`, exit 2."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"solm {argv[0]}: error: ") and needle in err and err.count("\n") == 1, err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- solm dashboard ------------------------------------------------------------------------------


def test_dashboard_port_0_is_refused(tmp_path, capsys):
    """Port 0 would be a port the system picks (the printed URL wrong): bad input, like 65536."""
    refused(["dashboard", str(tmp_path), "--port", "0", "--dry-run"], capsys, "--port 0 is not a port")


@pytest.fixture
def served(monkeypatch):
    """`solm dashboard` up to the server's start: the (command, environment) given to `serve`."""
    pytest.importorskip("streamlit")  # the command checks streamlit is there
    calls: list[tuple[list[str], dict[str, str]]] = []
    monkeypatch.setattr(dashboard, "serve", lambda cmd, env: calls.append((cmd, env)) or 0)
    return calls


def test_dashboard_environment_names_the_folders_given_over_stale_values(tmp_path, served, monkeypatch, capsys):
    """The app reads SOLM_TRACE_DIRS / SOLM_ALLOW_ANY_PATH first: every folder given goes there, and
    a stale value in the user's shell (any path allowed, another folder) does not win."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    monkeypatch.setenv("SOLM_TRACE_DIRS", "/")
    monkeypatch.setenv("SOLM_ALLOW_ANY_PATH", "1")
    port = _free_port()
    assert main(["dashboard", str(a), str(b), "--port", str(port)]) == 0
    cmd, env = served[-1]
    assert env["SOLM_TRACE_DIRS"] == os.pathsep.join([str(a.resolve()), str(b.resolve())])
    assert env["SOLM_ALLOW_ANY_PATH"] == "0"
    assert cmd[cmd.index("--server.address") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--server.port") + 1] == str(port)
    assert f"at http://127.0.0.1:{port}" in capsys.readouterr().out
    monkeypatch.setenv("SOLM_ALLOW_ANY_PATH", "0")
    assert main(["dashboard", str(a), "--port", str(port), "--allow-any-path"]) == 0
    assert served[-1][1]["SOLM_ALLOW_ANY_PATH"] == "1" and served[-1][1]["SOLM_TRACE_DIRS"] == str(a.resolve())


class FakeChild:
    """A stand-in for the Streamlit process: `waits` are what its successive wait() calls do."""

    def __init__(self, cmd, waits, **kwargs) -> None:
        self.cmd, self.kwargs, self.waits, self.calls = cmd, kwargs, list(waits), []
        self.sigterm_handler = signal.getsignal(signal.SIGTERM)  # as it was when the child started

    def wait(self, timeout=None):
        self.calls.append(("wait", timeout))
        w = self.waits.pop(0)
        if isinstance(w, BaseException):
            raise w
        return w

    def terminate(self):
        self.calls.append(("terminate",))

    def kill(self):
        self.calls.append(("kill",))


def _serve(monkeypatch, *waits) -> tuple[FakeChild | None, object]:
    made: list[FakeChild] = []
    monkeypatch.setattr(
        dashboard.subprocess, "Popen", lambda cmd, **kw: made.append(FakeChild(cmd, waits, **kw)) or made[-1]
    )
    try:
        result: object = dashboard.serve(["streamlit"], {"A": "1"})
    except BaseException as e:  # noqa: BLE001 - what serve let through is the result here
        result = e
    return (made[0] if made else None), result


def test_serve_returns_the_servers_exit_status_and_ties_it_to_this_process(monkeypatch):
    before = signal.getsignal(signal.SIGTERM)
    child, rc = _serve(monkeypatch, 3)
    assert rc == 3  # streamlit's own failure is the command's exit status, not 0
    assert child is not None and child.kwargs == {"env": {"A": "1"}, "preexec_fn": die_with_parent}
    assert child.sigterm_handler not in (before, signal.SIG_DFL)  # SIGTERM here stops the child first
    assert signal.getsignal(signal.SIGTERM) == before


def test_serve_stops_the_server_when_interrupted(monkeypatch):
    """Ctrl-C (or SIGTERM, as SystemExit) while serving: the server is asked to stop and waited
    for, killed if it does not stop in 10 s, and the interruption goes on."""
    child, result = _serve(monkeypatch, KeyboardInterrupt(), 0)
    assert isinstance(result, KeyboardInterrupt)
    assert child is not None and child.calls == [("wait", None), ("terminate",), ("wait", 10)]
    child, result = _serve(monkeypatch, SystemExit(143), subprocess.TimeoutExpired("streamlit", 10), 0)
    assert isinstance(result, SystemExit) and result.code == 143
    assert child is not None
    assert child.calls == [("wait", None), ("terminate",), ("wait", 10), ("kill",), ("wait", None)]


# --- the sweep's Ray backend ---------------------------------------------------------------------


class FakeRay:
    """A stand-in `ray` module: records init's arguments and the environment it saw."""

    def __init__(self) -> None:
        self.inits: list[dict] = []
        self.env: dict[str, str | None] = {}
        self.shutdowns = 0

    def init(self, **kwargs) -> None:
        self.inits.append(kwargs)
        keys = ("RAY_USAGE_STATS_ENABLED", "RAY_gcs_server_port_wait_time_s", "RAY_ADDRESS")
        self.env = {k: os.environ.get(k) for k in keys}
        self.temp_dir_existed = os.path.isdir(kwargs.get("_temp_dir", ""))
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as ray.init replaces it (twice, in Ray 2.60)

    def shutdown(self) -> None:
        self.shutdowns += 1

    def is_initialized(self) -> bool:
        return False


@pytest.fixture
def fake_ray(monkeypatch):
    """`ray` replaced; `entered` lists whether the loopback-node setting was taken."""
    ray = FakeRay()
    ray.loopback_node = []  # type: ignore[attr-defined]

    @contextlib.contextmanager
    def node():
        ray.loopback_node.append(True)  # type: ignore[attr-defined]
        yield ray

    monkeypatch.setattr(rb, "_loopback_node", node)
    monkeypatch.setattr(rb, "_import_ray", lambda: ray)
    monkeypatch.setattr(rb, "probe", lambda address: None)  # nothing is connected to
    monkeypatch.delenv("RAY_gcs_server_port_wait_time_s", raising=False)
    monkeypatch.delenv("RAY_USAGE_STATS_ENABLED", raising=False)
    return ray


@pytest.fixture
def keep_sigterm():
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


def test_local_ray_settings_and_cleanup(fake_ray, monkeypatch, keep_sigterm):
    """The local Ray: loopback node IP, no dashboard, no usage statistics, a temporary session
    folder removed at the end, the watchdog ended, the caller's SIGTERM handler back."""
    monkeypatch.setattr(rb, "warn_non_loopback", lambda: [])
    started: list[subprocess.Popen] = []
    real_popen = subprocess.Popen
    monkeypatch.setattr(rb.subprocess, "Popen", lambda *a, **kw: started.append(real_popen(*a, **kw)) or started[-1])

    def handler(signum, frame):  # the caller's
        raise SystemExit(1)

    signal.signal(signal.SIGTERM, handler)
    with rb.ray_session(None, workers=3) as ray:
        assert ray is fake_ray and signal.getsignal(signal.SIGTERM) is handler
        (kw,) = ray.inits
    assert kw["include_dashboard"] is False and kw["_node_ip_address"] == "127.0.0.1"
    assert kw["num_cpus"] == 3 and fake_ray.temp_dir_existed and Path(kw["_temp_dir"]).name.startswith("solm-ray-")
    assert fake_ray.env["RAY_USAGE_STATS_ENABLED"] == "0" and fake_ray.loopback_node == [True]
    assert fake_ray.shutdowns == 1 and not Path(kw["_temp_dir"]).exists()
    (watchdog,) = started
    assert watchdog.poll() is not None  # ended here, not left to notice the driver's exit
    assert "RAY_USAGE_STATS_ENABLED" not in os.environ  # the setting was for the session only


def test_local_ray_ignores_a_ray_address_in_the_environment(fake_ray, monkeypatch, keep_sigterm):
    """Without --address the Ray is the local loopback one even when RAY_ADDRESS is set (ray.init
    would join that cluster), and RAY_ADDRESS is back afterwards."""
    monkeypatch.setattr(rb, "warn_non_loopback", lambda: [])
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    with rb.ray_session(None, workers=1):
        assert fake_ray.env["RAY_ADDRESS"] is None and "address" not in fake_ray.inits[0]
    assert os.environ["RAY_ADDRESS"] == "10.0.0.1:6379"


def test_loopback_node_setting_holds_for_the_session_only(monkeypatch):
    """Ray reads RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER at import: within the session the variable is 0
    (for the Ray processes started, which import it afresh) and the imported switch is off; both are
    as they were afterwards."""
    pytest.importorskip("ray")
    import ray._private.ray_constants as constants

    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)
    monkeypatch.setattr(constants, "ENABLE_RAY_CLUSTER", True)
    with rb._loopback_node():
        assert constants.ENABLE_RAY_CLUSTER is False and os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    assert constants.ENABLE_RAY_CLUSTER is True and "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in os.environ


def test_local_means_the_loopback_local_ray_not_rays_own(fake_ray, monkeypatch):
    """Was: `--address local` went to ray.init(address="local"), which starts Ray's own local
    cluster, with none of this backend's settings: node IP on the machine's outward address (its
    servers listening beyond loopback), usage statistics on, the session left in /tmp/ray."""
    used: list[str] = []

    @contextlib.contextmanager
    def local(workers):
        used.append("local")
        yield fake_ray

    monkeypatch.setattr(rb, "_local", local)
    assert rb.parse_address("local") is None
    with rb.ray_session("local", workers=2) as ray:
        assert ray is fake_ray
    assert used == ["local"] and fake_ray.inits == []


def test_a_loopback_cluster_keeps_the_driver_on_loopback(fake_ray, keep_sigterm):
    with rb.ray_session("127.0.0.1:6379", workers=2):
        pass
    with rb.ray_session("ray://[::1]:10001", workers=2):
        pass
    assert fake_ray.loopback_node == [True, True]
    assert fake_ray.env["RAY_gcs_server_port_wait_time_s"] == "1"  # one connect attempt, not 20
    assert fake_ray.inits[0]["address"] == "127.0.0.1:6379" and fake_ray.shutdowns == 2
    assert "RAY_gcs_server_port_wait_time_s" not in os.environ


def test_probe_waits_the_connect_timeout(monkeypatch):
    """A cluster address that does not answer is given up after 5 s (was the complaint: Ray's own
    loop of 20 attempts); the probe's connect is given that timeout."""
    seen = []

    def connect(hp, timeout=None):
        seen.append((hp, timeout))
        raise TimeoutError

    monkeypatch.setattr(rb.socket, "create_connection", connect)
    with pytest.raises(
        ValueError, match=r"cannot reach a Ray cluster at 127\.0\.0\.1:6379: timed out \(connect timeout 5 s\)"
    ):
        rb.probe("127.0.0.1:6379")
    assert seen == [(("127.0.0.1", 6379), 5.0)]


def test_environ_restores_what_was_there():
    key, absent = "SOLM_TEST_MUT_SERVICES", "SOLM_TEST_MUT_SERVICES_ABSENT"
    os.environ[key] = "before"
    try:
        with rb._environ({key: "x", absent: "y"}):
            assert os.environ[key] == "x" and os.environ[absent] == "y"
        assert os.environ[key] == "before" and absent not in os.environ
    finally:
        os.environ.pop(key, None)


def test_listening_sockets_are_the_listening_ones_only():
    """The loopback check looks at listening sockets: a client connection's local port is not one."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname()) as client:
            found = rb.listening_sockets({os.getpid()})
            ports = {port for pid, _, ip, port in found if pid == os.getpid()}
            assert server.getsockname()[1] in ports and client.getsockname()[1] not in ports


# --- counter sampling ----------------------------------------------------------------------------


class FlakyNVML(FakeNVML):
    """The recorder tests' stand-in `pynvml` without an energy counter, at 100 W, whose power
    reading fails once (3rd sample) and whose shutdown fails."""

    def __init__(self) -> None:
        super().__init__(energy=False)
        self.power_calls = 0

    def nvmlShutdown(self):
        raise self.NVMLError("already shut down")

    def nvmlDeviceGetPowerUsage(self, h):
        self.power_calls += 1
        if self.power_calls == 3:
            raise self.NVMLError("unknown error")
        return 100_000  # mW


def test_integrated_energy_goes_on_after_a_failed_power_reading(monkeypatch):
    """One failed power reading is a NaN row; the energy integrated from power goes on from the last
    value before it (was: from 0, the cumulative energy falling back). A shutdown that fails does
    not lose the rows."""
    monkeypatch.setitem(sys.modules, "pynvml", FlakyNVML())
    s = CounterSampler(interval_s=1.0, origin=0.0)
    for _ in range(4):
        s.rows.append(s.sample_once())
    rows = s.stop()
    energy, t = [r["energy_mj"] for r in rows], [r["t_s"] for r in rows]
    assert len(rows) == 5 and math.isnan(energy[2]) and math.isnan(rows[2]["power_w"])
    assert energy[0] == 0.0 and energy[1] == pytest.approx(100.0 * (t[1] - t[0]) * 1000.0)
    assert energy[3] == pytest.approx(energy[1] + 100.0 * (t[3] - t[1]) * 1000.0)
    assert energy[4] == pytest.approx(energy[3] + 100.0 * (t[4] - t[3]) * 1000.0)


def test_sample_times_count_from_the_origin_and_host_rows_have_no_gpu_values():
    import time

    origin = time.perf_counter()
    s = CounterSampler(interval_s=1.0, origin=origin, use_nvml=False)
    row = s.sample_once()
    assert 0.0 <= row["t_s"] <= time.perf_counter() - origin
    gpu = ("gpu_memory_used_bytes", "gpu_utilization_percent", "power_w", "energy_mj", "sm_clock_mhz", "temperature_c")
    assert all(math.isnan(row[k]) for k in gpu) and row["rss_bytes"] > 0
