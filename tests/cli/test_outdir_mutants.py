"""profiler/outdir.py: what the data-loss tests left unpinned (a mutation round: 34 mutants, 28
killed by tests/cli/test_data_loss.py, tests/test_abuse_fs.py, tests/test_abuse_io.py and
tests/profiler/test_perfetto.py, 1 equivalent, 5 killed here; a 35th did not apply).

Equivalent: check_out_file comparing an input only with the resolved path and not also with the
entry named (an input resolves through its links, so it equals the entry only where the entry is
no link, and then the entry is the resolved path)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from profiler.errors import UsageError
from profiler.outdir import check_out_file, clear_dir, input_file, write_chunks_atomic
from solm.cli import main

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "traces" / "sequential-reverse_words"


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_an_input_file_that_is_no_regular_file_is_refused(tmp_path, kind):
    """A FIFO read whole blocks for ever, a device never ends: input_file refuses both, not only folders."""
    if kind == "fifo":
        path = tmp_path / "workload.csv"
        os.mkfifo(path)
    else:
        path = Path("/dev/zero")
    with pytest.raises(UsageError, match="not a regular file"):
        input_file(path, "workload")


def test_clearing_a_trace_keeps_the_users_hidden_files(tmp_path):
    """The writer's temporary files (.NAME.XXXX.tmp) go; a user's hidden files (.notes, .gitignore) stay."""
    d = tmp_path / "t"
    d.mkdir()
    (d / "meta.json").write_text('{"kind": "simulated"}')
    (d / ".meta.json.abc123.tmp").write_text("half written")
    (d / ".notes").write_text("mine\n")
    (d / ".gitignore").write_text("*.parquet\n")
    clear_dir(d)
    assert sorted(c.name for c in d.iterdir()) == [".gitignore", ".notes"]


def test_an_output_link_inside_the_input_is_refused_wherever_it_points(tmp_path, monkeypatch, capsys):
    """`export --perfetto T/link.json --force T`: the link lies inside the input trace, so replacing
    it (the rename replaces the entry, not its target) would change the input, even though the
    file it points to is outside."""
    monkeypatch.chdir(tmp_path)
    trace = tmp_path / "t"
    shutil.copytree(SHIPPED, trace)
    outside = tmp_path / "elsewhere.json"
    outside.write_text("{}")
    (trace / "link.json").symlink_to(outside)
    assert main(["export", "--perfetto", str(trace / "link.json"), "--force", str(trace)]) == 2
    assert "lies inside the input" in capsys.readouterr().err
    assert (trace / "link.json").is_symlink() and outside.read_text() == "{}"


def test_an_output_file_where_no_file_can_be_made_is_refused_up_front():
    """/proc takes no new file even from root, whom os.access lets through: the probe file says so
    before the command works (was: calibrate fitted for 20 s, then an internal error)."""
    needle = "cannot write in /proc" if os.geteuid() == 0 else "is not writable"
    with pytest.raises(UsageError, match=needle):
        check_out_file("/proc/solm-out.json")


def test_an_interrupted_atomic_write_leaves_no_temporary_file(tmp_path):
    """Ctrl-C (KeyboardInterrupt, no Exception) mid-write: the old file stays and no .tmp is left."""
    path = tmp_path / "out.json"
    path.write_text("old")

    def chunks():
        yield "new "
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_chunks_atomic(path, chunks())
    assert path.read_text() == "old" and [c.name for c in tmp_path.iterdir()] == ["out.json"]
