"""Where a command may write: the one check every `--out` goes through, and the writer's lock.

The rule (no command deletes or overwrites what it did not create or was not told to replace,
and never its own input):

- an output directory must not be, contain or lie inside any of the command's inputs, and must
  not be or contain the working directory;
- a non-empty output directory needs `--force`, and `--force` replaces only a directory this
  project wrote: a trace (meta.json kind measured or simulated), a GPU capture folder (kind
  gpu_capture), a sweep's folder (results.jsonl / sweep.parquet and nothing foreign), or, for
  `solm train`, a checkpoint (config.json format solm-tinylm-v1);
- an output file (`export --perfetto`, `diff --html`, `calibrate --out`) needs `--force` to replace
  an existing one, is never an input or inside one, and is written whole or not at all (temp file,
  rename); a link named is replaced, never written through, and only when it points to a regular
  file (a link to a pipe, a terminal or nothing, like `/dev/stdout`, is refused);
- a writer of a trace or sweep holds an exclusive `flock` on `OUT/.solm.lock` for its whole run,
  so a second writer into the same folder stops at once with one line instead of mixing rows.

Every refusal is a `UsageError` naming the path: one line, exit 2. `input_file` is the matching
check of an input file a command reads whole (a workload, a GEMM table, a calibration): it exists
and is a regular file, never a FIFO or a device that would block or never end.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Self

from profiler.errors import UsageError

LOCK_NAME = ".solm.lock"
TRACE_KINDS = ("measured", "simulated", "gpu_capture")  # meta.json kinds this project writes
SWEEP_FILES = ("results.jsonl", "sweep.parquet")
CHECKPOINT_FORMAT = "solm-tinylm-v1"
MAX_MARKER_BYTES = 1 << 20  # a meta.json / config.json larger than this is not one of ours


def input_file(path: str | Path, what: str, max_bytes: int | None = None) -> Path:
    """`path` as a Path if it is a regular file (of at most `max_bytes`); else a UsageError:
    "<what> <path> does not exist", "<what> <path>: not a regular file" or "...: N bytes, more than
    the M a <what> may hold" (a huge or sparse file read whole would fill memory or run for ever)."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{what} {path} does not exist")
    if not path.is_file():
        raise UsageError(f"{what} {path}: not a regular file")
    size = path.stat().st_size
    if max_bytes is not None and size > max_bytes:
        raise UsageError(f"{what} {path}: {size} bytes, more than the {max_bytes} a {what} may hold")
    return path


def resolved(path: str | Path) -> Path:
    """Absolute, symlinks followed (so two spellings of one folder compare equal). A '~' stays a
    name, as every reader and writer opens it (the shell expands an unquoted one): expanding it
    here checked $HOME/X while the writer wrote ./~/X, unchecked."""
    return Path(os.path.realpath(str(path)))


def check_given_once(paths: Iterable[str], what: str) -> None:
    """A UsageError "<what> <path> is given twice (as <earlier spelling>)" for the first path of
    `paths` that names a file or folder given earlier, however spelled (symlinks followed): a sweep
    would run its configurations twice, calibrate weigh its GEMMs twice, export draw it twice."""
    first: dict[str, str] = {}
    for path in paths:
        real = os.path.realpath(path)
        if real in first:
            earlier = first[real]
            raise UsageError(f"{what} {path} is given twice{'' if earlier == path else f' (as {earlier})'}")
        first[real] = path


def _inside(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents


def check_not_input(out: Path, inputs: Iterable[str | Path], flag: str) -> None:
    """`out` (resolved) is not, does not contain and is not inside an input, nor the working directory."""
    cwd = resolved(os.getcwd())
    if _inside(cwd, out):
        what = "is" if out == cwd else "contains"
        raise UsageError(f"{flag} {out} {what} the working directory; choose a new folder for the output")
    for item in inputs:
        if not item:
            continue
        src = resolved(item)
        if _inside(out, src) or _inside(src, out):
            rel = "is" if out == src else "lies inside" if _inside(out, src) else "contains"
            raise UsageError(f"{flag} {out} {rel} the input {item}; choose another {flag}")


def _small_json(file: Path) -> dict | None:
    try:
        if not file.is_file() or file.stat().st_size > MAX_MARKER_BYTES:
            return None
        doc = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def _entries(d: Path) -> list[Path]:
    return [c for c in d.iterdir() if c.name != LOCK_NAME]


def project_kind(d: Path) -> str | None:
    """What solm output `d` is ("measured", "simulated", "gpu_capture", "sweep", "checkpoint"),
    or None for anything else."""
    meta = _small_json(d / "meta.json")
    if meta is not None and meta.get("kind") in TRACE_KINDS:
        return str(meta["kind"])
    names = {c.name for c in _entries(d)}
    if names & set(SWEEP_FILES) and all(n in SWEEP_FILES or n.startswith(".") for n in names):
        return "sweep"
    cfg = _small_json(d / "config.json")
    if cfg is not None and cfg.get("format") == CHECKPOINT_FORMAT:
        return "checkpoint"
    return None


def check_out_dir(
    out: str | Path,
    inputs: Iterable[str | Path] = (),
    force: bool | None = False,
    flag: str = "--out",
    kinds: Iterable[str] = (*TRACE_KINDS, "sweep"),
    resume: str | None = None,
) -> Path:
    """Refuse (UsageError) an output folder the command may not use; return it resolved.

    `kinds`: the project outputs `--force` may replace. `resume`: a kind this command continues
    (sweep) rather than replaces, accepted without `--force`."""
    p = resolved(out)
    check_not_input(p, inputs, flag)
    if p.exists() and not p.is_dir():
        raise UsageError(f"{flag} {out} exists and is not a directory")
    if not p.exists() or not _entries(p):
        return p
    kind = project_kind(p)
    if resume is not None and kind == resume:
        return p
    if not force:
        hint = "" if force is None else " or pass --force to replace it"  # None: the command has no --force
        raise UsageError(f"{flag} {out} exists and is not empty (choose another {flag}{hint})")
    if kind not in set(kinds):
        what = f"a solm {kind} output" if kind else "not an output solm wrote (no solm meta.json)"
        raise UsageError(f"{flag} {out} is {what}; --force replaces only an empty folder or one of: {', '.join(kinds)}")
    return p


# what a trace writer puts in its folder (profiler/writer.py), and a GPU capture folder's traces:
# replaced by --force; anything else a user keeps beside a trace (a README, notes) is left as it is
TRACE_FILES = ("meta.json", "graph.json")
TRACE_SUFFIXES = (".parquet",)
PARTS = "parts"  # the writer's per-request commits before a trace is finished
TRACE_DIRS = (PARTS,)


def _trace_written(c: Path) -> bool:
    if c.is_symlink():
        return False
    if c.is_dir():  # the writer's parts, or a trace of a GPU capture folder's
        return c.name in TRACE_DIRS or project_kind(c) in TRACE_KINDS
    return (
        c.name in TRACE_FILES or c.name.endswith(TRACE_SUFFIXES) or (c.name.startswith(".") and c.name.endswith(".tmp"))
    )


def clear_dir(d: Path) -> None:
    """Remove what a trace writer wrote in `d` (tables, graph, meta, parts, temporary files): the
    caller holds the lock and checked that `d` is a trace solm wrote. Other files stay."""
    for c in _entries(d):
        if not _trace_written(c):
            continue
        if c.is_dir():
            shutil.rmtree(c)
        else:
            c.unlink()


class OutLock:
    """An exclusive, non-blocking `flock` on `DIR/.solm.lock`, held until `release()` (or the
    process ends: the kernel drops it, so a killed writer never leaves a stale lock)."""

    def __init__(self, d: Path, flag: str = "--out") -> None:
        self.dir = d
        self.path = d / LOCK_NAME
        self.created = False  # set by claim_out_dir: the folder did not exist before
        try:  # a link is not followed: was, a .solm.lock linked to a file truncated that file (or created its target)
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except OSError as error:
            if error.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                raise
            why = "a link" if error.errno == errno.ELOOP else error.strerror or "cannot open it"  # ELOOP: O_NOFOLLOW's
            raise UsageError(self._not_a_lock(flag, why)) from None
        if not stat.S_ISREG(os.fstat(self.fd).st_mode):  # a FIFO: ftruncate failed, an internal error
            os.close(self.fd)
            raise UsageError(self._not_a_lock(flag, "not a regular file"))
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(self.fd)
            raise UsageError(
                f"{flag} {d} is being written by another solm process (pid {holder}); "
                f"wait for it or choose another {flag}"
            ) from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, str(os.getpid()).encode(), 0)

    def _not_a_lock(self, flag: str, why: str) -> str:
        return f"{flag} {self.dir}: {LOCK_NAME} there is not a lock file solm made ({why}); remove it or choose another {flag}"

    def release(self) -> None:
        """Drop the lock; a folder claimed new that holds nothing but the lock goes away again."""
        if self.fd < 0:
            return
        if self.created and not _entries(self.dir):
            shutil.rmtree(self.dir, ignore_errors=True)
        os.close(self.fd)
        self.fd = -1

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def claim_out_dir(
    out: str | Path,
    inputs: Iterable[str | Path] = (),
    force: bool | None = False,
    flag: str = "--out",
    kinds: Iterable[str] = (*TRACE_KINDS, "sweep"),
    resume: str | None = None,
) -> OutLock:
    """Check `out`, create it and lock it; the writer replaces its contents later (so a run that
    fails before writing leaves an old output as it was).

    Use as `with claim_out_dir(args.out, [args.trace], args.force): write...`. The checks run
    again under the lock: another writer may have filled the folder since. A folder this call
    created is removed again if nothing was written into it."""
    kinds = tuple(kinds)
    p = check_out_dir(out, inputs, force, flag, kinds, resume)
    created = not p.exists()
    try:
        p.mkdir(parents=True, exist_ok=True)
        lock = OutLock(p, flag)
    except PermissionError:
        raise UsageError(f"{flag} {out}: not writable") from None
    except (FileNotFoundError, NotADirectoryError, FileExistsError) as e:
        raise UsageError(f"{flag} {out}: cannot create it ({e.strerror})") from None
    lock.created = created
    try:
        check_out_dir(p, inputs, force, flag, kinds, resume)
    except BaseException:
        lock.release()
        raise
    return lock


def check_out_file(
    out: str | Path, inputs: Iterable[str | Path] = (), force: bool = False, flag: str = "--out"
) -> Path:
    """Refuse (UsageError) an output file the command may not write; return the path to write: the
    entry named (a link given is replaced, not the file it points to), its folder resolved.

    Both the entry and what it points to are checked: a link to a pipe or a terminal (`/dev/stdout`)
    or to nothing is not a regular file to replace, and a name ending in '/' names a folder."""
    p = resolved(out)
    if p.is_dir():
        raise UsageError(f"{flag} {out} is a directory; give a file path")
    if str(out).endswith(("/", os.sep)):
        raise UsageError(f"{flag} {out} ends in '/', a folder's name; give a file path")
    given = Path(out)
    entry = resolved(given.parent) / given.name  # what the rename replaces
    for item in inputs:
        if item and resolved(item) in (p, entry):
            raise UsageError(f"{flag} {out} is the input {item}; write it elsewhere")
        if item and (_inside(p, resolved(item)) or _inside(entry, resolved(item))):
            raise UsageError(f"{flag} {out} lies inside the input {item}; write it elsewhere")
    if not entry.parent.is_dir():
        raise UsageError(f"{flag} {out}: no such directory {entry.parent}")
    if os.path.lexists(entry):
        if not p.is_file():
            raise UsageError(f"{flag} {out} exists and is not a regular file")
        if not force:
            raise UsageError(f"{flag} {out} exists (pass --force to overwrite it)")
    if not os.access(entry.parent, os.W_OK):
        raise UsageError(f"{flag} {out}: folder {entry.parent} is not writable")
    try:  # os.access says yes to root in /proc or on a read-only mount: a file there fails at the end
        tempfile.TemporaryFile(dir=entry.parent).close()
    except OSError as error:  # was: calibrate --out /proc/x.json fitted for 20 s, then an internal error
        raise UsageError(f"{flag} {out}: cannot write in {entry.parent} ({error.strerror})") from None
    return entry


def write_file_atomic(path: Path, data: str | bytes) -> None:
    """Write `path` whole or not at all: a temporary file beside it, renamed over it."""
    write_chunks_atomic(path, [data])


def write_chunks_atomic(path: Path, chunks: Iterable[str | bytes]) -> None:
    """`write_file_atomic` of the pieces `chunks` yields, one after another (a text too large to
    hold whole); if one of them raises, `path` is as it was and the temporary file is removed."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk.encode() if isinstance(chunk, str) else chunk)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
