"""Test helpers for processes and sockets: what `ss` says is listening, a process's descendants,
and waiting until processes are gone. `ss` (iproute2) is the oracle, independent of the code under
test (which checks its own sockets with psutil)."""

from __future__ import annotations

import re
import shutil
import subprocess
import time

import psutil
import pytest


def ss_listeners() -> list[tuple[int, str, str, int]]:
    """(pid, process name, local ip, port) of every listening TCP socket `ss -ltnpH` shows with a pid."""
    if shutil.which("ss") is None:
        pytest.skip("ss (iproute2) is not installed")
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 6:
            continue
        host, _, port = fields[3].rpartition(":")
        for m in re.finditer(r'\("([^"]*)",pid=(\d+)', " ".join(fields[5:])):
            rows.append((int(m.group(2)), m.group(1), host.strip("[]"), int(port)))
    return rows


def descendants(pid: int) -> set[int]:
    try:
        return {c.pid for c in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def alive(pids: set[int]) -> set[int]:
    """The pids still running (zombies awaiting their reaper count as gone)."""
    out = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.add(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_gone(pids: set[int], timeout_s: float = 30.0) -> set[int]:
    """Wait until none of `pids` runs; return those still running at the deadline (a hang guard)."""
    deadline = time.monotonic() + timeout_s
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive(pids)


def wait_for(predicate, timeout_s: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)
