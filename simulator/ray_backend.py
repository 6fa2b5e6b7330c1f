"""The sweep's Ray backend: a local Ray bound to loopback, or a connection to an existing cluster.

What: `ray_session(address, workers)` is a context manager that yields the `ray` module ready to
run tasks, and tears everything down on exit (also on SIGTERM/Ctrl-C, through `finally`).
- Local (no address): Ray 2.60 decides where its servers listen from the node IP it resolves,
  and `ray.init(_node_ip_address="127.0.0.1")` alone does not stick: `resolve_ip_for_localhost`
  turns loopback into the machine's outward address unless `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`
  is set before `ray` is imported (it is read at import, as `ray_constants.ENABLE_RAY_CLUSTER`).
  With it, gcs_server, raylet (node manager and object manager), the core workers, the driver and
  the runtime-env agent all listen on 127.0.0.1; `include_dashboard=False` leaves the dashboard
  process without an HTTP port and the dashboard agent without a metrics port. After start every
  listening TCP socket of the Ray processes is checked, and any that is not on loopback is named
  in a warning line (none in Ray 2.60 with these settings; tests/simulator/test_ray_backend.py
  asserts it with `ss`). The session folder is a temporary directory removed at the end (no
  /tmp/ray/session_*) and usage statistics are off. Ray's own token authentication stays as Ray
  sets it up (on by default in 2.60, with its per-user token in ~/.ray/auth_token).
- `address="local"` is the local Ray above (Ray's own `ray.init(address="local")` would start one
  with none of these settings: its node IP the machine's outward address).
- Existing cluster (`address`): the address is probed with a TCP connect first (5 s), so a wrong
  address is one line, not Ray's connect loop (20 attempts of about half a minute each at its
  defaults; RAY_gcs_server_port_wait_time_s); a port that accepts but is not a GCS fails after
  one attempt (set to 1 here unless the environment sets it).

    with ray_session(None, workers=2) as ray:
        print(ray.get(ray.remote(lambda: 1).remote()))
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

from profiler.errors import UsageError
from profiler.services import is_loopback

CONNECT_TIMEOUT_S = 5.0
LOCAL_ENV = {"RAY_USAGE_STATS_ENABLED": "0"}  # no usage report leaves the machine


def parse_address(address: str) -> tuple[str, int] | None:
    """(host, port) of `host:port` or `ray://host:port`; None for `auto` (Ray finds it)."""
    if address in ("auto", "local"):
        return None
    parts = urlsplit(address if "://" in address else f"//{address}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None or port < 1:
        raise UsageError(f"--address {address!r} is not HOST:PORT (e.g. 127.0.0.1:6379 or ray://HOST:10001)")
    return parts.hostname, port


def probe(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Raise UsageError unless something accepts TCP connections at `address` within `timeout_s`."""
    hp = parse_address(address)
    if hp is None:
        return
    try:
        with socket.create_connection(hp, timeout=timeout_s):
            pass
    except OSError as e:
        reason = "timed out" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        raise UsageError(
            f"cannot reach a Ray cluster at {address}: {reason} (connect timeout {timeout_s:g} s) "
            "(start one with `ray start --head`, or leave out --address for a local one)"
        ) from None


def listening_sockets(pids: set[int]) -> list[tuple[int, str, str, int]]:
    """(pid, process name, ip, port) of every listening TCP socket of these processes."""
    import psutil

    out = []
    for pid in sorted(pids):
        try:
            p = psutil.Process(pid)
            name = p.name()
            conns = p.net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        out += [(pid, name, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]
    return out


def ray_processes() -> set[int]:
    """This process (the Ray driver) and every process below it (gcs_server, raylet, workers, agents)."""
    import psutil

    me = psutil.Process()
    return {me.pid, *(c.pid for c in me.children(recursive=True))}


def warn_non_loopback() -> list[tuple[int, str, str, int]]:
    """Print one warning line naming every Ray socket not on loopback; return them."""
    exposed = [s for s in listening_sockets(ray_processes()) if not is_loopback(s[2])]
    if exposed:
        names = ", ".join(f"{name} on {ip}:{port}" for _, name, ip, port in exposed)
        print(f"solm sweep: warning: the local Ray listens beyond loopback: {names}", file=sys.stderr, flush=True)
    return exposed


# A SIGKILLed driver runs no `finally`: Ray's gcs_server, raylet and workers then die with it
# (Ray's own fate sharing), but its dashboard and runtime-env agents outlived it (over a minute) in
# Ray 2.60, and the session folder stayed. This watchdog, a sibling process, notes the driver's
# descendants every half second; when the driver is gone it stops them and removes the folder.
# On a normal exit the driver cleans up itself and ends the watchdog. It ignores Ctrl-C (sent to
# the whole terminal group) so that it is still there if the driver dies of it.
WATCHDOG = """
import os, shutil, signal, sys, time
import psutil
signal.signal(signal.SIGINT, signal.SIG_IGN)
driver, folder = psutil.Process(int(sys.argv[1])), sys.argv[2]
seen = {}
while True:
    try:
        if not driver.is_running() or driver.status() == psutil.STATUS_ZOMBIE:
            break
        seen.update({c.pid: c for c in driver.children(recursive=True) if c.pid != os.getpid()})
    except psutil.Error:
        break
    time.sleep(0.5)
procs = [p for p in seen.values() if p.is_running()]
for p in procs:
    try:
        p.terminate()
    except psutil.Error:
        pass
for p in psutil.wait_procs(procs, timeout=5)[1]:
    try:
        p.kill()
    except psutil.Error:
        pass
shutil.rmtree(folder, ignore_errors=True)
"""


@contextlib.contextmanager
def _environ(values: Mapping[str, str | None]) -> Iterator[None]:
    """The environment with `values` set (None: unset) for the block, then as it was."""
    old = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError("--backend ray needs the ray package (pip install ray)") from None
    return ray


@contextlib.contextmanager
def _loopback_node() -> Iterator[Any]:
    """`ray` with its node IP on loopback, whether or not it was imported before the setting."""
    with _environ({"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}):
        ray = _import_ray()
        import ray._private.ray_constants as constants  # the import-time switch, set for this session

        before = constants.ENABLE_RAY_CLUSTER
        constants.ENABLE_RAY_CLUSTER = False
        try:
            yield ray
        finally:
            constants.ENABLE_RAY_CLUSTER = before


@contextlib.contextmanager
def _caller_signal_handlers() -> Iterator[None]:
    """Keep the caller's SIGTERM/SIGHUP handlers across `ray.init`, which replaces SIGTERM's twice
    (a Python `sys.exit` handler, then the core worker's C++ crash handler that aborts): with the
    caller's back, SIGTERM runs its `finally` blocks, which shut Ray down."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in saved.items():
            if h is not None:
                signal.signal(s, h)


@contextlib.contextmanager
def _local(workers: int) -> Iterator[Any]:
    tmp = tempfile.mkdtemp(prefix="solm-ray-")
    watchdog = subprocess.Popen([sys.executable, "-c", WATCHDOG, str(os.getpid()), tmp], stdin=subprocess.DEVNULL)
    try:
        # RAY_ADDRESS unset: ray.init() would read it and join that cluster instead (was: an
        # internal error, Ray refusing num_cpus for an existing cluster, or a cluster joined)
        with _environ({**LOCAL_ENV, "RAY_ADDRESS": None}), _loopback_node() as ray:
            with _caller_signal_handlers():
                ray.init(
                    include_dashboard=False,
                    dashboard_host="127.0.0.1",
                    object_store_memory=100 * 1024**2,
                    num_cpus=workers,
                    _node_ip_address="127.0.0.1",
                    _temp_dir=tmp,
                    log_to_driver=False,
                    logging_level=logging.WARNING,
                )
            try:
                warn_non_loopback()
                yield ray
            finally:
                ray.shutdown()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        watchdog.terminate()
        watchdog.wait()


@contextlib.contextmanager
def _connect(address: str) -> Iterator[Any]:
    probe(address)
    hp = parse_address(address)
    loopback = hp is not None and is_loopback(hp[0])
    env = {"RAY_gcs_server_port_wait_time_s": os.environ.get("RAY_gcs_server_port_wait_time_s", "1")}
    # on loopback, keep the driver there too (else Ray rewrites 127.0.0.1 to the outward address)
    node = _loopback_node() if loopback else contextlib.nullcontext(_import_ray())
    with _environ(env), node as ray:
        try:
            with _caller_signal_handlers():
                ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        except ConnectionError as e:
            raise UsageError(f"cannot connect to a Ray cluster at {address}: {e}") from None
        try:
            yield ray
        finally:
            ray.shutdown()


@contextlib.contextmanager
def ray_session(address: str | None, workers: int) -> Iterator[Any]:
    """`ray`, initialised (see the module docstring); an already initialised Ray is used as it is."""
    ray = _import_ray() if "ray" in sys.modules else None
    if ray is not None and ray.is_initialized():
        yield ray
    elif address and address != "local":  # was: "local" went to Ray's own local cluster (not on loopback)
        with _connect(address) as ray:
            yield ray
    else:
        with _local(workers) as ray:
            yield ray
