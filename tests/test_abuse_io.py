"""Bad input to capture, train, inspect, diff and export, and the trace and checkpoint reading they
share: each case here ended in a traceback (exit 1), a hang, a silent success or a message naming
the wrong fault; now each is one line `solm <command>: error: ...`, exit 2, before any work, and
the user's files are as they were (each case names what it did before)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from solm.cli import main

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "traces" / "sequential-reverse_words"
CKPT = REPO / "checkpoints" / "sequential-tiny"


def digest(root: Path) -> dict[str, str]:
    """Every file under `root` and its hash (FIFOs and links by name): what must survive."""
    out = {}
    for p in sorted(root.rglob("*")):
        key = str(p.relative_to(root))
        out[key] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink() else "other"
    return out


@pytest.fixture
def work(tmp_path, monkeypatch) -> Path:
    """The user's folder: a trace `t`, a checkpoint `ckpt` and notes; the working directory."""
    shutil.copytree(SHIPPED, tmp_path / "t")
    shutil.copytree(CKPT, tmp_path / "ckpt")
    (tmp_path / "notes.txt").write_text("the user's notes\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def refused(argv: list[str], capsys, needle: str, root: Path) -> None:
    """`argv` exits 2 with one line naming `needle`, and nothing under `root` changed."""
    before = digest(root)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"solm {argv[0]}: error: ") and needle in err and err.count("\n") == 1, err
    assert digest(root) == before


def _edit_json(file: Path, edit: Callable[[dict], None]) -> None:
    doc = json.loads(file.read_text())
    edit(doc)
    file.write_text(json.dumps(doc))


def _config(key: str, value) -> Callable[[Path], None]:
    return lambda c: _edit_json(c / "config.json", lambda d: d["config"].__setitem__(key, value))


# ---- checkpoints: `capture --model DIR` and `train --init DIR` -------------------------------
def _nan_weight(c: Path) -> None:
    from safetensors.torch import load_file, save_file

    weights = load_file(str(c / "model.safetensors"))
    weights["lm_head.weight"][0, 0] = float("nan")
    save_file(weights, str(c / "model.safetensors"))


CORRUPT_CHECKPOINTS = [
    # was SafetensorError (exit 1)
    (lambda c: (c / "model.safetensors").write_bytes(b""), "not a readable safetensors file"),
    (
        lambda c: (c / "model.safetensors").write_bytes((c / "model.safetensors").read_bytes()[:1000]),
        "not a readable safetensors file",
    ),
    (_config("n_layers", float("nan")), "n_layers must be an integer"),  # was TypeError
    (_config("d_model", -4), "d_model must be an integer"),  # was RuntimeError: negative dimension
    (_config("d_model", 10**12), "d_model must be an integer in 1..1048576"),  # was: tried to allocate 1 PB
    (_config("n_heads", 0), "n_heads must be an integer"),  # was ZeroDivisionError
    (_config("n_heads", 3), "must divide by n_heads"),  # was ValueError (exit 1)
    (_config("n_layers", 2), "does not match"),  # was RuntimeError from load_state_dict
    (lambda c: (c / "config.json").write_bytes(b"\xff\xfe\xff"), "not valid JSON"),  # was UnicodeDecodeError
    (_nan_weight, "tensor lm_head.weight holds NaN or infinite values"),  # was: exit 0, outputs from NaN logits
    # the weights' shapes still match (128 x 128 q projection): was ValueError from apply_rope (exit 1)
    (lambda c: _config("n_heads", 128)(c) or _config("n_kv_heads", 64)(c), "must be even"),
    # was: exit 0 with every output from NaN logits (1e-308 is 0 in float32, and so is every
    # rotary frequency), or from constant logits (a norm eps beyond float32 is inf)
    (_config("rope_theta", 1e-308), "rope_theta must be a number in [1.18e-38, 3.4e+38]"),
    (_config("norm_eps", 1e308), "norm_eps must be a number in [1.18e-38, 3.4e+38]"),
    # was: exit 0, the integers or booleans cast to float32 weights by load_state_dict
    (lambda c: _retype(c, "int32"), "tensor embed.weight is of dtype I32, not a float"),
    (lambda c: _retype(c, "bool"), "is of dtype BOOL, not a float"),
    # was: "unreadable checkpoint config ('config')", a KeyError's repr
    (
        lambda c: _edit_json(c / "config.json", lambda d: d.pop("config")),
        "not a solm checkpoint config (no 'config' key)",
    ),
]


def _retype(c: Path, dtype: str) -> None:
    """The checkpoint's weights as integers or booleans: a well-formed safetensors file of the right shapes."""
    import torch
    from safetensors.torch import load_file, save_file

    weights = load_file(str(c / "model.safetensors"))
    save_file({k: v.to(getattr(torch, dtype)) for k, v in weights.items()}, str(c / "model.safetensors"))


@pytest.mark.parametrize("damage,needle", CORRUPT_CHECKPOINTS)
def test_a_corrupt_checkpoint_is_one_line(damage, needle, work, capsys, monkeypatch):
    import runtime.train.sft

    def not_reached(*a, **kw):
        raise AssertionError("trained from a corrupt checkpoint")

    monkeypatch.setattr(runtime.train.sft, "train", not_reached)
    damage(work / "ckpt")
    refused(["capture", "--model", "ckpt", "--n", "1", "--max-tokens", "4", "--out", "c"], capsys, needle, work)
    refused(["train", "--init", "ckpt", "--steps", "1", "--out", "o"], capsys, needle, work)
    assert not (work / "c").exists() and not (work / "o").exists()


@pytest.mark.parametrize(
    "change,needle",
    [
        # was: internal error (a bug): IndexError: index out of range in self (exit 1), from the embedding
        ({"vocab_size": 100}, "holds token id 259, outside the model's vocabulary of 100"),
        # was: internal error (a bug): ValueError: prompt of 21 tokens exceeds the model's 8 positions;
        # train trained, saved, then failed in its evaluation (exit 1, the checkpoint left behind)
        ({"max_positions": 8}, "positions, more than the model's 8"),
    ],
)
def test_a_checkpoint_too_small_for_the_task_is_one_line(change, needle, work, capsys):
    """A well-formed checkpoint of another vocabulary or fewer positions than the task's sequences need."""
    import dataclasses

    from runtime.checkpoint import save_checkpoint
    from runtime.model import ModelConfig, TinyLM

    save_checkpoint(TinyLM(dataclasses.replace(ModelConfig.from_name("tiny-2l"), **change)), work / "small")
    refused(["capture", "--model", "small", "--n", "1", "--max-tokens", "2", "--out", "c"], capsys, needle, work)
    load = ["--concurrency", "1"]
    refused(["capture", "--model", "small", "--n", "1", "--max-tokens", "2", *load, "--out", "c"], capsys, needle, work)
    refused(["train", "--init", "small", "--steps", "1", "--out", "o"], capsys, needle, work)
    assert not (work / "c").exists() and not (work / "o").exists()


def test_a_capture_whose_every_request_failed_is_not_a_result(work, capsys):
    """Was: exit 0, "captured 2 requests" (both error rows: no pass fits a one-page pool), every
    figure n/a, and the trace it wrote refused by `solm inspect` (an error row's graph was {}, not
    node-link). Now exit 2 naming the first error, and the trace it wrote is valid."""
    argv = ["capture", "--concurrency", "1", "--kv-budget-mib", "0.04", "--n", "2", "--max-tokens", "2", "--out", "c"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "every request failed (request 0: its first pass needs" in err, err
    assert "the trace in" in err and main(["inspect", "c", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["errors"] == 2


def test_a_fifo_config_does_not_hang(work):
    """Was: `capture --model DIR` blocked for ever reading DIR/config.json, a FIFO."""
    (work / "ckpt" / "config.json").unlink()
    os.mkfifo(work / "ckpt" / "config.json")
    r = subprocess.run(
        [sys.executable, "-m", "solm", "capture", "--model", "ckpt", "--n", "1", "--out", "c"],
        cwd=work,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "not a solm checkpoint" in r.stderr, r.stderr


# ---- train: flags and --out checked before training ------------------------------------------
@pytest.fixture
def no_training(monkeypatch):
    """Training fails loudly: a refusal must come before it."""
    import runtime.train.sft

    def not_reached(*a, **kw):
        raise AssertionError("trained before refusing")

    monkeypatch.setattr(runtime.train.sft, "train", not_reached)


@pytest.mark.parametrize(
    "flags,needle",
    [
        (["--system", "pasta", "--stage", "bogus"], "pasta stages are"),  # was ValueError (exit 1)
        (["--system", "planned_diffusion", "--stage", "bogus"], "planned_diffusion stages are"),
        (["--batch-size", "1000000000"], "--batch-size must be in 1..4096"),  # was: built 10^9 sequences, a hang
        (["--steps", "1000000000000"], "--steps must be in"),
        (["--lr", "1e300"], "--lr must be a number in (0, 1000]"),  # was RuntimeError: float overflow
        (["--seed", "-1"], "--seed must be in 0.."),  # was: accepted (capture refuses it)
        (["--seed", "99999999999999999999999"], "--seed must be in"),  # was ValueError: Overflow
        (["--threads", "100000"], "--threads must be in 0..1024"),  # was OSError: Cannot allocate memory
    ],
)
def test_train_flags_checked_up_front(flags, needle, work, capsys, no_training):
    refused(["train", *flags, "--out", "o"], capsys, needle, work)
    assert not (work / "o").exists()


def test_train_that_diverges_stops_at_the_first_non_finite_loss(work, capsys):
    """Was: `--lr 1000` trained on with loss nan to the last step, saved the NaN weights, then
    evaluated them for minutes (garbage to every max_tokens), exit 0 with "final loss nan"."""
    argv = ["train", "--lr", "1000", "--steps", "30", "--batch-size", "4", "--json", "--out", "o"]
    refused(argv, capsys, "diverged (--lr 1000 too high for this model", work)
    assert not (work / "o").exists()


def test_train_out_that_cannot_be_created_is_refused_before_training(work, capsys, no_training):
    """Was: trained for the whole run, then failed to save (exit 2 after the progress lines)."""
    refused(["train", "--steps", "1", "--out", "notes.txt/x"], capsys, "cannot create it", work)


def test_a_shipped_checkpoint_named_by_name_is_an_input(work, tmp_path_factory, capsys, monkeypatch, no_training):
    """Was: `train --init NAME --out checkpoints/NAME --force` (NAME not a path from the working
    directory) was not seen as its own input and overwrote it; `capture --model NAME` likewise
    wrote a trace inside the checkpoint it read."""
    import runtime.checkpoint

    shipped = tmp_path_factory.mktemp("repo") / "checkpoints"
    shutil.copytree(CKPT, shipped / "seq")
    monkeypatch.setattr(runtime.checkpoint, "CHECKPOINTS_DIR", shipped)
    before = digest(shipped)
    refused(
        ["train", "--init", "seq", "--steps", "1", "--out", str(shipped / "seq"), "--force"],
        capsys,
        "is the input",
        work,
    )
    refused(
        ["capture", "--model", "seq", "--n", "1", "--out", str(shipped / "seq" / "t")], capsys, "inside the input", work
    )
    assert digest(shipped) == before


# ---- capture ---------------------------------------------------------------------------------
def _graphs_of_ints(t: Path) -> None:
    graphs = json.loads((t / "graph.json").read_text())
    (t / "graph.json").write_text(json.dumps(dict.fromkeys(graphs, 5)))


def test_capture_structure_from_an_invalid_trace_is_refused(work, capsys):
    """Was: exit 0, a replay of a trace whose dependence graphs were not graphs."""
    _graphs_of_ints(work / "t")
    argv = ["capture", "--model", "tiny-2l", "--structure-from", "t", "--n", "1", "--out", "c"]
    refused(argv, capsys, "t: not a valid trace: graph 0: not node-link", work)
    assert not (work / "c").exists()


def test_capture_kv_budget_beyond_memory_is_refused(work, capsys):
    """Was: RuntimeError from torch's allocator (exit 1) for a 10^9 MiB pool."""
    argv = ["capture", "--model", "tiny-2l", "--n", "1", "--concurrency", "1", "--kv-budget-mib", "1e9", "--out", "c"]
    refused(argv, capsys, "does not fit in the", work)
    assert not (work / "c").exists()


# ---- the trace reader and validator (inspect, diff, export) ----------------------------------
def test_a_graph_that_is_not_an_object_is_a_validation_problem(work, capsys):
    """Was: AttributeError: 'int' object has no attribute 'get' (exit 1) in diff and export."""
    _graphs_of_ints(work / "t")
    needle = "graph 0: not node-link"
    refused(["diff", str(SHIPPED), "t"], capsys, needle, work)
    refused(["export", "t", "--perfetto", "x.json"], capsys, needle, work)
    before = digest(work)
    assert main(["inspect", "t", "--validate"]) == 2
    assert f"problem: {needle}" in capsys.readouterr().out
    assert digest(work) == before


@pytest.mark.parametrize("tokens", [float("nan"), "12", -3, True])
def test_graph_node_tokens_must_be_a_count(tokens, work, capsys):
    """Was: valid; diff reported `b_tokens: NaN` as a changed chunk length."""
    _edit_json(work / "t" / "graph.json", lambda g: g["0"]["nodes"][0].__setitem__("tokens", tokens))
    refused(["diff", str(SHIPPED), "t"], capsys, "tokens must be an integer >= 0", work)


@pytest.mark.parametrize("table", ["requests", "counters"])
@pytest.mark.parametrize("make", [os.mkdir, os.mkfifo])
def test_a_table_that_is_not_a_file_is_named_so(table, make, work, capsys):
    """Was: "t: missing requests.parquet" for a file that is there (a folder or a FIFO)."""
    (work / "t" / f"{table}.parquet").unlink()
    make(work / "t" / f"{table}.parquet")
    refused(["inspect", "t"], capsys, f"{table}.parquet: not a regular file", work)


def test_diff_names_a_schema_version_of_the_wrong_type(work, capsys):
    """Was: "runs/a is v1, t is v1" for versions 1 and "1"."""
    _edit_json(work / "t" / "meta.json", lambda m: m.__setitem__("schema_version", "1"))
    refused(["diff", str(SHIPPED), "t"], capsys, "t is v'1'", work)


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["diff", "t", "t", "--html", ""], "--html is empty"),  # was: exit 0, no report, no word
        (["export", "t", "--perfetto", ""], "--perfetto is empty"),  # was: "--perfetto  is a directory"
    ],
)
def test_an_empty_output_file_is_refused(argv, needle, work, capsys):
    refused(argv, capsys, needle, work)


@pytest.mark.parametrize(
    "flags,needle",
    [
        (["--knob", "a=" + "[" * 50000], "--knob a: not valid JSON (nested too deeply)"),  # was RecursionError (exit 1)
        (
            ["--knob", "a=" + "9" * 5000],
            "--knob a: not valid JSON (an integer of more than 4300 digits)",
        ),  # was ValueError (exit 1)
        (["--model", "gguf:"], "needs a path"),  # model_path: "gguf:" alone is not the working directory
        # was: exit 0, the string "nan" (not JSON) taken as true by a bool knob; 1 likewise
        (["--system", "planned_diffusion", "--knob", "block_sparse=nan"], "block_sparse takes bool"),
        (["--system", "tip", "--knob", "registers=2.5"], "tip's registers takes int"),
        # was: internal error (a bug): ValueError from the diffusion layout (exit 1)
        (
            ["--system", "masked_diffusion", "--knob", "length=5000", "--max-tokens", "5000"],
            "exceeds the model's 2048 positions",
        ),
        (["--system", "masked_diffusion", "--knob", "length=5000"], "length 5000 exceeds max_tokens 192"),
    ],
)
def test_capture_model_and_knob_values(flags, needle, work, capsys):
    refused(["capture", "--model", "tiny-2l", "--n", "1", *flags, "--out", "c"], capsys, needle, work)
    assert not (work / "c").exists()


def test_a_transformers_folder_that_does_not_load_is_one_line(work, capsys):
    """Was: transformers' OSError (no weights) or ValueError (unknown model_type), exit 1."""
    pytest.importorskip("transformers")
    for cfg, needle in (
        ({"model_type": "llama"}, "not a loadable transformers directory"),
        ({"model_type": "nonesuch"}, "model_type 'nonesuch' is not supported by the adapter"),
    ):
        (work / "hf").mkdir(exist_ok=True)
        (work / "hf" / "config.json").write_text(json.dumps(cfg))
        refused(["capture", "--model", "hf", "--n", "1", "--out", "c"], capsys, needle, work)


LONG = "a" * 300  # one path component over NAME_MAX (255)


@pytest.mark.parametrize(
    "argv",
    [
        ["inspect", LONG],
        ["diff", "t", LONG],
        ["export", "t", "--perfetto", LONG],
        ["diff", "t", "t", "--html", LONG],
        ["capture", "--model", "tiny-2l", "--n", "1", "--out", LONG],
        ["capture", "--model", LONG, "--n", "1", "--out", "c"],
        ["train", "--steps", "1", "--out", LONG],
    ],
)
def test_a_name_too_long_is_the_users_error(argv, work, capsys, no_training):
    """Was: OSError [Errno 36] File name too long, reported as a bug (exit 1)."""
    refused(argv, capsys, "File name too long", work)


@pytest.mark.parametrize("token_id", [10**9, -3])
def test_capture_structure_from_token_ids_outside_the_vocabulary(token_id, work, capsys):
    """Was: IndexError in the embedding (exit 1) for an id past the vocabulary; exit 0, a replay
    forcing garbage, for a negative id (a simulated trace's -1)."""
    import pandas as pd

    tokens = pd.read_parquet(work / "t" / "tokens.parquet").assign(token_id=token_id)
    tokens.to_parquet(work / "t" / "tokens.parquet", index=False)
    argv = ["capture", "--model", "tiny-2l", "--structure-from", "t", "--n", "1", "--out", "c"]
    refused(argv, capsys, f"request 0 has token id {token_id}, outside this model's 0..", work)
    assert not (work / "c").exists()


def test_train_lambda_without_a_stage_is_refused(work, capsys, no_training):
    """Was: accepted and ignored (the default recipe has no reward to weigh)."""
    refused(["train", "--lambda", "0.5", "--out", "o"], capsys, "--lambda weighs a preference stage", work)


def test_diff_html_force_on_a_link_replaces_the_link_not_its_target(work, capsys):
    """Was: `diff --html LINK --force` wrote through LINK over the user's file it pointed to
    (`export --perfetto LINK --force` replaced the link itself, as now both do)."""
    (work / "report.html").symlink_to("notes.txt")
    assert main(["diff", "t", "t", "--html", "report.html", "--force", "--json"]) == 0
    capsys.readouterr()
    assert (work / "notes.txt").read_text() == "the user's notes\n"
    assert not (work / "report.html").is_symlink() and "<html" in (work / "report.html").read_text().lower()


def test_no_room_for_the_output_is_the_users_error(work, capsys, monkeypatch):
    """Was: `solm inspect t > /dev/full` reported OSError ENOSPC as a bug (exit 1)."""
    import errno
    import io

    class Full(io.StringIO):
        def write(self, s: str) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(sys, "stdout", Full())
    refused(["inspect", "t"], capsys, "No space left on device", work)


@pytest.mark.parametrize(
    "argv,needle",
    [
        # each was: the empty value taken for "not given" (`--init "$CKPT"` with CKPT unset trained
        # from scratch, exit 0; --structure-from "" captured without replay) or for the working
        # directory (`diff t ""`, `inspect ""`: ".: no meta.json"; `dashboard ""` served it)
        (["capture", "--structure-from", "", "--n", "1", "--out", "c"], "--structure-from is empty"),
        (["capture", "--model", "", "--n", "1", "--out", "c"], "--model is empty"),
        (["capture", "--task", " ", "--n", "1", "--out", "c"], "--task is empty"),
        (["train", "--init", "", "--steps", "1", "--out", "o"], "--init is empty"),
        (["train", "--system", "pasta", "--stage", "", "--out", "o"], "--stage is empty"),
        (["diff", "t", ""], "B is empty; give a value"),
        (["inspect", ""], "trace is empty; give a value"),
        (["export", "t", "", "--perfetto", "x.json"], "TRACE is empty; give a value"),
        (["dashboard", "t", "", "--dry-run"], "DIR is empty"),
    ],
)
def test_an_empty_value_is_not_taken_for_no_value(argv, needle, work, capsys, no_training):
    refused(argv, capsys, needle, work)
    assert not (work / "c").exists() and not (work / "o").exists()


@pytest.mark.parametrize("init", ["arch:tiny-llama", "hf", "gguf:m.gguf"])
def test_train_from_a_transformers_model_is_refused(init, work, capsys):
    """Was: `train --init arch:tiny-llama` (or a local transformers directory) loaded the model,
    then AttributeError 'HFCausalLM' object has no attribute 'forward_dense' (exit 1)."""
    pytest.importorskip("transformers")
    from runtime.hf_adapter import build_arch

    build_arch("tiny-llama", seed=0).hf.save_pretrained(work / "hf")
    (work / "m.gguf").write_bytes(b"GGUF")
    capsys.readouterr()  # save_pretrained's own progress bar
    refused(["train", "--init", init, "--steps", "1", "--out", "o"], capsys, "not a transformers or GGUF model", work)
    assert not (work / "o").exists()
