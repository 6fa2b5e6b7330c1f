"""The command line as a user meets it. `solm(...)` runs the real console entry in a subprocess."""

from __future__ import annotations

import subprocess
import sys


def solm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "solm", *args], capture_output=True, text=True, timeout=300)
