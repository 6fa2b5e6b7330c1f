"""A user's clone has no `../shared` beside it: no module, bench script, Makefile, test or doc of
the repository may refer to it. The one place it may be named is the README of copied data
(`.../data/**/README*`), as where the copy came from. `.ci/` (the CI entry point, which describes
the machine it runs on) is not scanned."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {
    ".git",
    ".venv",
    ".ci",
    "__pycache__",
    ".pytest_cache",
    ".ruff_cache",
    ".mypy_cache",
    "node_modules",
    "out",
    "runs",
    "build",
    "dist",
}
BINARY = {".parquet", ".safetensors", ".pt", ".bin", ".png", ".jpg", ".gz", ".zip", ".npz", ".npy", ".gguf"}
MAX_BYTES = 4 * 2**20
SHARED = "shared"
PATTERNS = [
    re.compile(r"\.\.[/\\]" + SHARED + r"\b"),  # ../shared, ..\shared
    re.compile(r"parents?(\[\d+\])?\s*/\s*[\"']" + SHARED + r"[\"'/]"),  # Path(...).parent / "shared"
    re.compile(r"[\"']\.\.[\"']\s*,\s*[\"']" + SHARED + r"[\"']"),  # os.path.join(x, "..", "shared")
]


def text_files(root: Path):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        for name in filenames:
            p = Path(dirpath) / name
            if p.suffix.lower() in BINARY or p.is_symlink() or p.stat().st_size > MAX_BYTES:
                continue
            data = p.read_bytes()
            if b"\0" in data[:8192]:
                continue
            yield p, data.decode("utf-8", errors="replace")


def allowed(path: Path, root: Path) -> bool:
    """The README of copied data may say where the copy came from."""
    rel = path.relative_to(root)
    return "data" in rel.parts[:-1] and rel.name.upper().startswith("README")


def references(root: Path) -> list[str]:
    out = []
    for path, text in text_files(root):
        if allowed(path, root) or path == Path(__file__).resolve():  # this file spells the patterns out
            continue
        for i, line in enumerate(text.splitlines(), 1):
            if any(p.search(line) for p in PATTERNS):
                out.append(f"{path.relative_to(root)}:{i}: {line.strip()[:120]}")
    return out


def test_nothing_refers_to_the_shared_folder():
    assert references(ROOT) == []


def test_the_scan_finds_each_form(tmp_path):
    """The check itself: each way of reaching the folder is found; a copied data README is allowed."""
    up = ".." + "/" + SHARED
    (tmp_path / "mod.py").write_text(f'DATA = "{up}/data/vidur-a100"\n')
    (tmp_path / "calib.py").write_text(f'p = Path(__file__).parents[2] / "{SHARED}" / "data"\n')
    (tmp_path / "bench.py").write_text(f'os.path.join(ROOT, "..", "{SHARED}", "x.csv")\n')
    (tmp_path / "Makefile").write_text(f"data:\n\tcp -r {up}/data .\n")
    (tmp_path / "data" / "x").mkdir(parents=True)
    (tmp_path / "data" / "x" / "README.md").write_text(f"Copied from {up}/data/x.\n")
    (tmp_path / "w.parquet").write_bytes(up.encode())  # binary tables are not read
    found = sorted(r.split(":")[0] for r in references(tmp_path))
    assert found == ["Makefile", "bench.py", "calib.py", "mod.py"]
