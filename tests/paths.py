"""Shared checks on input paths that are not regular files."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest


def check_not_a_file(read: Callable[[Path], object], tmp_path: Path) -> None:
    """`read` gives a missing path, a directory and a FIFO each their own reason (one ValueError
    line), and never blocks reading the FIFO."""
    with pytest.raises(ValueError, match="does not exist"):
        read(tmp_path / "absent.csv")
    with pytest.raises(ValueError, match="not a regular file"):
        read(tmp_path)
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        read(fifo)
