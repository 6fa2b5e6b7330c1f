"""No command deletes or overwrites what it did not create or was not told to replace, and never
its own input. Each case here lost data before `profiler/outdir.py` (named in its docstring);
now each is refused with one line, exit 2, and every byte of the inputs is still there."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import threading
from pathlib import Path

import pytest

from profiler import outdir
from profiler.errors import UsageError
from profiler.outdir import (
    LOCK_NAME,
    MAX_MARKER_BYTES,
    TRACE_KINDS,
    OutLock,
    check_out_dir,
    claim_out_dir,
    clear_dir,
    input_file,
    project_kind,
    write_file_atomic,
)
from solm.cli import main

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "traces" / "sequential-reverse_words"


def digest(root: Path) -> dict[str, str]:
    """Every file under `root` (lock files aside) and its hash: what must survive."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != LOCK_NAME
    }


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A working directory holding a copy of a shipped trace and the user's own notes."""
    w = tmp_path / "work"
    shutil.copytree(SHIPPED, w / "t")
    (w / "notes.txt").write_text("my notes\n")
    monkeypatch.chdir(w)
    return w


def refused(argv: list[str], capsys, needle: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_capture_out_dot_force_keeps_the_working_directory(work, capsys):
    """Was: `capture --out . --force` emptied the working directory, input trace included."""
    before = digest(work)
    refused(["capture", "--model", "tiny-2l", "--n", "1", "--out", ".", "--force"], capsys, "working directory")
    refused(["simulate", "t", "--hardware", "h100-sxm", "--out", ".", "--force"], capsys, "working directory")
    refused(
        ["capture", "--model", "tiny-2l", "--n", "1", "--out", str(work.parent), "--force"],
        capsys,
        "contains the working directory",
    )
    assert digest(work) == before


def test_force_on_a_folder_of_traces_or_user_files_is_refused(work, tmp_path, capsys):
    """Was: `--out PARENT --force` deleted the sibling traces in PARENT (and any other folder)."""
    parent = tmp_path / "runs"
    shutil.copytree(SHIPPED, parent / "a")
    shutil.copytree(SHIPPED, parent / "b")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("\\section{}")
    snap = {p: digest(p) for p in (parent, mine)}
    for out in (parent, mine):
        refused(
            ["simulate", "t", "--hardware", "h100-sxm", "--out", str(out), "--force"], capsys, "--force replaces only"
        )
        refused(
            ["capture", "--model", "tiny-2l", "--n", "1", "--out", str(out), "--force"], capsys, "--force replaces only"
        )
    assert {p: digest(p) for p in snap} == snap


def test_out_is_or_contains_or_lies_inside_the_input(work, capsys):
    """Was: `simulate T --out T --force` and `capture --structure-from T --out T --force` replaced
    their own input."""
    before = digest(work)
    refused(["simulate", "t", "--hardware", "h100-sxm", "--out", "t", "--force"], capsys, "is the input t")
    refused(["simulate", "./t/", "--hardware", "h100-sxm", "--out", str(work / "t"), "--force"], capsys, "is the input")
    refused(["simulate", "t", "--hardware", "h100-sxm", "--out", "t/sim", "--force"], capsys, "lies inside the input")
    refused(
        ["capture", "--model", "tiny-2l", "--structure-from", "t", "--n", "1", "--out", "t", "--force"],
        capsys,
        "is the input t",
    )
    (work / "link").symlink_to(work / "t")
    refused(["simulate", "t", "--hardware", "h100-sxm", "--out", "link", "--force"], capsys, "is the input")
    assert digest(work) == before


def test_force_replaces_a_trace_solm_wrote(work, capsys):
    """The allowed case still works: --force over a simulated trace replaces it."""
    args = ["simulate", "t", "--hardware", "h100-sxm", "--num-requests", "4", "--out", "sim", "--json"]
    assert main(args) == 0
    refused(args, capsys, "exists and is not empty")
    assert main([*args, "--force"]) == 0
    assert json.loads((work / "sim" / "meta.json").read_text())["kind"] == "simulated"


def test_force_keeps_files_solm_did_not_write_beside_a_trace(work, capsys):
    """--force replaces a trace's tables, graph and meta, not a README the user put beside them
    (a forced capture of the shipped smollm2 traces deleted theirs)."""
    args = ["simulate", "t", "--hardware", "h100-sxm", "--num-requests", "4", "--out", "sim", "--json"]
    assert main(args) == 0
    (work / "sim" / "README.md").write_text("how I made this\n")
    (work / "sim" / "stale.parquet").write_bytes(b"old table")
    before = (work / "sim" / "requests.parquet").stat().st_mtime_ns
    assert main([*args[:-4], "8", "--out", "sim", "--json", "--force"]) == 0
    capsys.readouterr()
    assert (work / "sim" / "README.md").read_text() == "how I made this\n"
    assert not (work / "sim" / "stale.parquet").exists()  # a table name: the writer's, replaced
    assert (work / "sim" / "requests.parquet").stat().st_mtime_ns != before


def test_export_and_diff_never_overwrite_without_force_nor_an_input(work, capsys):
    """Was: `export --perfetto FILE` and `diff --html FILE` overwrote any file, a trace's own
    meta.json included."""
    before = digest(work)
    refused(["export", "t", "--perfetto", "t/meta.json", "--force"], capsys, "lies inside the input")
    refused(["diff", "t", "t", "--html", "t/meta.json", "--force"], capsys, "lies inside the input")
    refused(["export", "t", "--perfetto", "notes.txt"], capsys, "pass --force")
    refused(["diff", "t", "t", "--html", "notes.txt"], capsys, "pass --force")
    refused(["export", "t", "--perfetto", "t"], capsys, "is a directory")
    refused(["diff", "t", "t", "--html", "."], capsys, "is a directory")
    refused(["export", "t", "--perfetto", "nowhere/x.json"], capsys, "no such directory")
    assert digest(work) == before
    assert main(["export", "t", "--perfetto", "notes.txt", "--force", "--json"]) == 0  # told to replace it
    assert json.loads((work / "notes.txt").read_text())["traceEvents"]


def test_train_never_overwrites_a_checkpoint_without_force(work, tmp_path, capsys):
    """Was: `solm train --out DIR` overwrote a trained checkpoint (and any folder)."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(REPO / "checkpoints" / "sequential-tiny", ckpt)
    before = digest(ckpt)
    refused(["train", "--out", str(ckpt), "--steps", "1"], capsys, "pass --force")
    refused(["train", "--out", ".", "--force", "--steps", "1"], capsys, "working directory")
    refused(["train", "--out", str(ckpt), "--init", str(ckpt), "--force", "--steps", "1"], capsys, "is the input")
    refused(["train", "--out", str(work), "--force", "--steps", "1"], capsys, "working directory")
    assert digest(ckpt) == before


def test_a_second_writer_is_refused_while_the_first_holds_out(work, capsys):
    """Was: two captures into one --out at once left a mixed trace that validated."""
    out = work / "busy"
    with claim_out_dir(out):  # the first writer, mid-run
        refused(
            ["simulate", "t", "--hardware", "h100-sxm", "--out", str(out), "--force"],
            capsys,
            "being written by another solm process",
        )
        refused(
            ["capture", "--model", "tiny-2l", "--n", "1", "--out", str(out), "--force"],
            capsys,
            "being written by another solm process",
        )
        refused(
            ["sweep", "t", "--hardware", "h100-sxm", "--out", str(out)], capsys, "being written by another solm process"
        )
    with claim_out_dir(out):  # released when the first writer finished
        pass


def test_claim_leaves_no_empty_folder_behind(tmp_path):
    out = tmp_path / "new"
    with claim_out_dir(out):
        assert (out / LOCK_NAME).exists()
    assert not out.exists()


def test_sweep_resume_does_not_depend_on_spelling(work, capsys):
    """Was: resume keyed rows by the trace path as typed, so `./t/` redid everything `t` had done."""
    args = [
        "--hardware",
        "h100-sxm",
        "--max-seqs",
        "1,2",
        "--num-requests",
        "4",
        "--workers",
        "1",
        "--out",
        "sw",
        "--json",
    ]
    assert main(["sweep", "t", *args]) == 0
    lines = (work / "sw" / "results.jsonl").read_text().splitlines()
    assert len(lines) == 2
    assert main(["sweep", "./t/", *args]) == 0
    assert main(["sweep", str(work / "t"), *args]) == 0
    assert (work / "sw" / "results.jsonl").read_text().splitlines() == lines  # nothing re-run
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["configs"] == 2
    (work / "other").mkdir()
    (work / "other" / "data.csv").write_text("1,2\n")
    refused(["sweep", "t", *args[:-3], "--out", "other"], capsys, "exists and is not empty")
    assert (work / "other" / "data.csv").read_text() == "1,2\n"


def _solm_trace(d: Path, kind: str = "simulated") -> Path:
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"kind": kind}))
    (d / "requests.parquet").write_bytes(b"table")
    return d


def test_force_never_replaces_an_output_that_holds_an_input(tmp_path):
    """A GPU capture folder holds traces: `--out FOLDER --force` with one of them as input would
    clear it (a trace folder inside is the writer's to replace)."""
    folder = _solm_trace(tmp_path / "capture", kind="gpu_capture")
    inner = _solm_trace(folder / "run0")
    with pytest.raises(UsageError, match="contains the input"):
        check_out_dir(folder, [inner], force=True, kinds=TRACE_KINDS)
    assert check_out_dir(folder, [tmp_path / "elsewhere"], force=True, kinds=TRACE_KINDS) == folder.resolve()


def test_force_replaces_only_the_kinds_the_command_writes(tmp_path):
    """A checkpoint is solm's, but not a trace or a sweep: `--force` of a trace writer refuses it;
    `solm train` (kinds checkpoint) may replace it."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"format": "solm-tinylm-v1"}))
    with pytest.raises(UsageError, match="is a solm checkpoint output"):
        check_out_dir(ckpt, force=True)
    assert check_out_dir(ckpt, force=True, kinds=("checkpoint",)) == ckpt.resolve()


def test_a_sweep_folder_holds_nothing_foreign(tmp_path):
    """results.jsonl beside a user's file is not a sweep folder: `--force` does not replace it."""
    d = tmp_path / "sw"
    d.mkdir()
    (d / "results.jsonl").write_text("{}\n")
    (d / LOCK_NAME).write_text("")
    assert project_kind(d) == "sweep"
    (d / "notes.txt").write_text("mine\n")
    assert project_kind(d) is None
    with pytest.raises(UsageError, match="not an output solm wrote"):
        check_out_dir(d, force=True)


def test_clearing_a_trace_keeps_the_users_folders_and_links(tmp_path):
    """clear_dir removes what a trace writer writes (tables, meta, parts), never a folder or a link
    of the user's, even one named like a table."""
    d = _solm_trace(tmp_path / "t")
    (d / "parts").mkdir()
    (d / "parts" / "0.json").write_text("{}")
    (d / "notes").mkdir()
    (d / "notes" / "plan.txt").write_text("mine\n")
    (tmp_path / "keep.parquet").write_bytes(b"user table")
    (d / "linked.parquet").symlink_to(tmp_path / "keep.parquet")
    clear_dir(d)
    assert sorted(c.name for c in d.iterdir()) == ["linked.parquet", "notes"]
    assert (d / "notes" / "plan.txt").read_text() == "mine\n"
    assert (tmp_path / "keep.parquet").read_bytes() == b"user table"


def test_releasing_a_claim_keeps_an_empty_folder_that_was_there(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    with claim_out_dir(out):
        pass
    assert out.is_dir() and [c.name for c in out.iterdir()] == [LOCK_NAME]  # only the lock was added


@pytest.mark.parametrize("kind", ["link to a file", "dangling link", "fifo", "directory"])
def test_a_lock_entry_that_is_not_a_lock_file_is_refused_untouched(work, capsys, kind):
    """Was: `.solm.lock` linked to the user's notes truncated them to the writer's pid (a dangling
    link created its target); a FIFO there was an internal error (ftruncate: EINVAL)."""
    out = work / "s"
    out.mkdir()
    lock = out / LOCK_NAME
    if kind == "link to a file":
        lock.symlink_to(work / "notes.txt")
    elif kind == "dangling link":
        lock.symlink_to(work / "made-by-the-lock")
    elif kind == "fifo":
        os.mkfifo(lock)
    else:
        lock.mkdir()
    why = {"link to a file": "a link", "dangling link": "a link", "fifo": "not a regular file"}.get(
        kind, "Is a directory"
    )
    with pytest.raises(UsageError, match=rf"\.solm\.lock there is not a lock file solm made \({why}\)"):
        claim_out_dir(out)
    refused(
        ["sweep", "t", "--hardware", "h100-sxm", "--num-requests", "2", "--out", str(out)], capsys, "not a lock file"
    )
    assert (work / "notes.txt").read_text() == "my notes\n"
    assert not (work / "made-by-the-lock").exists()


# ---- the module's own checks, one property each (a mutation round on profiler/outdir.py) ------
def test_input_file_limit_is_inclusive_and_a_missing_file_is_named(tmp_path):
    """A file of exactly `max_bytes` is read; one byte more is refused; a missing file says so."""
    f = tmp_path / "w.json"
    f.write_bytes(b"x" * 64)
    assert input_file(f, "workload file", 64) == f
    f.write_bytes(b"x" * 65)
    with pytest.raises(UsageError, match="65 bytes, more than the 64"):
        input_file(f, "workload file", 64)
    with pytest.raises(UsageError, match="absent.json does not exist"):
        input_file(tmp_path / "absent.json", "workload file")


def test_an_empty_input_does_not_end_the_input_checks(tmp_path):
    """An empty input is skipped, not the end of the list: capture's inputs are [--structure-from or
    None, the model's folder or ''], so a `break` there left `--out MODEL_DIR --force` unchecked."""
    t = _solm_trace(tmp_path / "t")
    with pytest.raises(UsageError, match="is the input"):
        check_out_dir(t, ["", t], force=True)


def _fifo_meta(d: Path, doc: str) -> threading.Thread:
    """`d/meta.json` a FIFO a writer waits to fill with `doc`: read it and it is a solm trace."""
    os.mkfifo(d / "meta.json")

    def write() -> None:
        with open(d / "meta.json", "w") as f:  # blocks until a reader opens it
            f.write(doc)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    return writer


def _let_go(fifo: Path, writer: threading.Thread) -> None:
    """Open the FIFO's read end while the writer finishes (then it never blocks nor breaks a pipe)."""
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        writer.join()
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    "make",
    [
        "huge",  # larger than any meta.json solm writes
        "deep",  # nested past the parser's recursion limit
        "list",  # JSON, not an object
        "fifo",  # a reader would block on it (and then read what another process feeds it)
        "foreign kind",  # a meta.json of a kind no trace writer writes
    ],
)
def test_a_meta_json_that_is_not_a_solm_trace_s_is_not_a_trace(tmp_path, make):
    """project_kind reads only a small regular meta.json object naming a trace kind; anything else
    beside the user's files is not an output `--force` may replace."""
    d = tmp_path / "mine"
    d.mkdir()
    (d / "notes.txt").write_text("mine\n")
    writer = None
    if make == "huge":
        (d / "meta.json").write_text(json.dumps({"kind": "simulated", "pad": "x" * MAX_MARKER_BYTES}))
    elif make == "deep":
        (d / "meta.json").write_text("[" * 100_000 + "]" * 100_000)
    elif make == "list":
        (d / "meta.json").write_text('[{"kind": "simulated"}]')
    elif make == "fifo":
        writer = _fifo_meta(d, json.dumps({"kind": "simulated"}))
    else:
        (d / "meta.json").write_text(json.dumps({"kind": "sweep"}))
    try:
        assert project_kind(d) is None
        with pytest.raises(UsageError, match="not an output solm wrote"):
            check_out_dir(d, force=True)
    finally:
        if writer is not None:
            _let_go(d / "meta.json", writer)


def test_what_makes_a_sweep_folder_and_a_checkpoint(tmp_path):
    """A folder of dotfiles only is not a sweep; a sweep with the temporary file of an interrupted
    table write still is; a config.json is a checkpoint only in solm's format (not a Hugging Face
    model folder)."""
    dots = tmp_path / "dots"
    dots.mkdir()
    (dots / ".envrc").write_text("export X=1\n")
    assert project_kind(dots) is None
    sw = tmp_path / "sw"
    sw.mkdir()
    (sw / "results.jsonl").write_text("{}\n")
    (sw / ".sweep.parquet.k2j4.tmp").write_bytes(b"half a table")
    assert project_kind(sw) == "sweep"
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert project_kind(hf) is None
    with pytest.raises(UsageError, match="not an output solm wrote"):
        check_out_dir(hf, force=True, kinds=("checkpoint",))


def test_resume_continues_only_its_own_kind(tmp_path):
    """`sweep --out TRACE` (resume sweep, no --force) is refused: a trace is not a sweep to continue."""
    t = _solm_trace(tmp_path / "t")
    with pytest.raises(UsageError, match="exists and is not empty"):
        check_out_dir(t, force=None, resume="sweep")


def test_claim_force_does_not_replace_a_checkpoint_by_default(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"format": "solm-tinylm-v1"}))
    with pytest.raises(UsageError, match="is a solm checkpoint output"):
        claim_out_dir(ckpt, force=True)
    with claim_out_dir(ckpt, force=True, kinds=("checkpoint",)):
        pass


def test_clearing_a_capture_folder_clears_its_traces_not_the_users_temp_files(tmp_path):
    """A GPU capture folder's traces are the writer's; a `notes.tmp` of the user's is not (only the
    writer's hidden `.NAME.tmp` are)."""
    d = _solm_trace(tmp_path / "cap", kind="gpu_capture")
    _solm_trace(d / "run0")
    (d / ".meta.json.x1.tmp").write_text("half")
    (d / "notes.tmp").write_text("mine\n")
    clear_dir(d)
    assert sorted(c.name for c in d.iterdir()) == ["notes.tmp"]


def test_a_nested_new_out_is_created_and_a_file_is_not_a_folder(tmp_path):
    with claim_out_dir(tmp_path / "a" / "b"):
        assert (tmp_path / "a" / "b" / LOCK_NAME).is_file()
    (tmp_path / "f").write_text("mine\n")
    with pytest.raises(UsageError, match="exists and is not a directory"):
        check_out_dir(tmp_path / "f", force=True)
    assert (tmp_path / "f").read_text() == "mine\n"


def test_a_socket_lock_entry_is_refused(tmp_path, monkeypatch):
    """A `.solm.lock` that is a socket (open: ENXIO) is one line, not an internal error."""
    out = tmp_path / "s"
    out.mkdir()
    monkeypatch.chdir(tmp_path)  # a short name: a socket's path is limited to 108 bytes
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(f"s/{LOCK_NAME}")
        with pytest.raises(UsageError, match=r"not a lock file solm made \("):
            claim_out_dir(out)


def test_the_lock_holds_the_writers_pid_only(tmp_path):
    """A lock file left with a longer pid names this writer's pid, not a mix of the two."""
    out = tmp_path / "s"
    out.mkdir()
    (out / LOCK_NAME).write_text("9" * 30)
    with claim_out_dir(out):
        assert (out / LOCK_NAME).read_text() == str(os.getpid())


def test_the_checks_run_again_under_the_lock(tmp_path, monkeypatch):
    """A folder filled by another writer between the first check and the lock is refused, the lock
    dropped and the folder left as that writer left it."""
    out = tmp_path / "s"

    class Late(OutLock):
        def __init__(self, d: Path, flag: str = "--out") -> None:
            super().__init__(d, flag)
            (d / "data.csv").write_text("another writer's\n")  # it finished just before we locked

    monkeypatch.setattr(outdir, "OutLock", Late)
    with pytest.raises(UsageError, match="exists and is not empty"):
        claim_out_dir(out)
    assert (out / "data.csv").read_text() == "another writer's\n"
    monkeypatch.undo()
    (out / "data.csv").unlink()
    with claim_out_dir(out):  # the refused claim let its lock go
        pass


def test_write_file_atomic_leaves_no_temporary_file_and_hides_it_meanwhile(tmp_path, monkeypatch):
    """A failed write leaves the old file and no temporary file; the temporary file is hidden (a
    dot name), so one left by a killed writer keeps a sweep folder a sweep folder."""
    sw = tmp_path / "sw"
    sw.mkdir()
    (sw / "results.jsonl").write_text("{}\n")
    (sw / "sweep.parquet").write_bytes(b"old")
    kinds = []

    def replace(src, dst):
        kinds.append(project_kind(sw))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError):
        write_file_atomic(sw / "sweep.parquet", b"new")
    assert kinds == ["sweep"]
    assert sorted(c.name for c in sw.iterdir()) == ["results.jsonl", "sweep.parquet"]
    assert (sw / "sweep.parquet").read_bytes() == b"old"
