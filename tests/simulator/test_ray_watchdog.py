"""The Ray backend's watchdog script on its own, without Ray: a driver SIGKILLed (no `finally` runs)
leaves processes and a session folder; the watchdog, started by the driver, must stop the driver's
descendants (SIGKILL for one that ignores SIGTERM), remove the folder and exit, and a Ctrl-C sent to
the whole terminal group must not take it down first. tests/simulator/test_ray_backend.py checks
the same with a real Ray session, which is slower and needs ray installed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from simulator.ray_backend import WATCHDOG

# The driver: two children (one ignores SIGTERM, as an agent stuck in shutdown would; the other has a
# child of its own, as Ray's workers are the raylet's), the watchdog
# started as in `_local` (a child of the driver, given its pid and the folder), then the pids on stdout.
DRIVER = """
import subprocess, sys, time
folder = sys.argv[1]
stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
parent = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); time.sleep(120)"
kids = [subprocess.Popen([sys.executable, "-c", c]) for c in (stubborn, parent)]
watchdog = subprocess.Popen([sys.executable, "-c", sys.argv[2], str(__import__("os").getpid()), folder])
print(*(p.pid for p in kids), watchdog.pid, flush=True)
time.sleep(120)
"""


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait(condition, limit_s: float) -> bool:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def test_a_killed_driver_leaves_no_process_and_no_folder(tmp_path: Path):
    folder = tmp_path / "solm-ray-session"
    (folder / "logs").mkdir(parents=True)
    (folder / "logs" / "raylet.out").write_text("log\n")
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(folder), WATCHDOG], stdout=subprocess.PIPE, text=True)
    started: list[int] = []  # every process the case starts, killed at the end whatever happened
    try:
        stubborn, plain, watchdog = (int(p) for p in driver.stdout.readline().split())
        started += [stubborn, plain, watchdog]
        assert _wait(lambda: len(psutil.Process(plain).children()) == 1, 10.0)
        (grandchild,) = (c.pid for c in psutil.Process(plain).children())
        started.append(grandchild)
        time.sleep(1.5)  # the watchdog notes the driver's descendants every half second
        os.kill(watchdog, signal.SIGINT)  # Ctrl-C reaches the whole group; the watchdog ignores it
        time.sleep(0.3)
        assert not _gone(watchdog), "the watchdog died of Ctrl-C before the driver"
        assert not _gone(stubborn) and not _gone(plain) and folder.exists()  # nothing done while the driver lives
        driver.kill()  # SIGKILL: no finally; left unreaped here, so the watchdog sees a zombie driver
        assert _wait(lambda: _gone(plain), 5.0), "a child that obeys SIGTERM outlived the driver"
        assert _wait(lambda: _gone(grandchild), 5.0), "a grandchild outlived the driver"
        assert _wait(lambda: not folder.exists(), 10.0), "the session folder stayed"
        assert _gone(stubborn), "a child that ignores SIGTERM was not killed"
        assert _wait(lambda: _gone(watchdog), 5.0), "the watchdog did not exit"
    finally:
        driver.kill()
        driver.wait()
        for pid in started:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_watchdog_leaves_a_live_driver_alone_and_exits_when_it_is_gone(tmp_path: Path):
    """A driver that exits on its own (its children gone first) ends the watchdog too, and the
    watchdog never signals a process that is not the driver's."""
    folder = tmp_path / "session"
    folder.mkdir()
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.2)"])
    watchdog = subprocess.Popen([sys.executable, "-c", WATCHDOG, str(driver.pid), str(folder)])
    try:
        assert watchdog.wait(timeout=15) == 0
        assert not folder.exists()
        assert bystander.poll() is None, "the watchdog stopped a process the driver did not start"
    finally:
        for p in (bystander, driver, watchdog):
            p.kill()
            p.wait()
