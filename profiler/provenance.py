"""What produced a trace: solm's version and the git commit of the checkout it ran from, recorded
in `meta.json` (`solm_version`, `git_commit`) and printed by `solm --version`."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def solm_version() -> str:
    try:
        from importlib.metadata import version

        return version("solm")
    except Exception:  # not installed: running from a checkout
        return "0.1.0+checkout"


def git_commit() -> str:
    """The checkout's HEAD commit; "" when solm is not run from a git checkout (installed as a
    package, whose folder may lie inside someone else's repository) or git is absent."""
    if not (REPO_ROOT / ".git").exists():  # a folder in a checkout, or a worktree's file
        return ""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def version_line() -> str:
    """`solm 0.1.0 (commit 1a2b3c4d5e6f)`, or without the commit outside a checkout."""
    commit = git_commit()
    return f"solm {solm_version()}" + (f" (commit {commit[:12]})" if commit else "")
