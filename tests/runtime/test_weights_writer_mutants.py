"""Mutation round on the real-weights and checkpoint paths: runtime/hf_adapter.py, runtime/gguf.py,
runtime/checkpoint.py and profiler/writer.py (their first round).

66 hand-made mutants (hf_adapter 23, gguf 16, checkpoint 12, writer 15), run against the tests that
exercise each module (test_hf_adapter.py; test_gguf.py with the gguf package installed; test_abuse_io.py,
test_model_kv.py, cli/test_data_loss.py; profiler/test_trace.py, test_capture_repeats.py,
cli/test_data_loss.py, simulator/test_simtrace_compact.py):
- 23 killed by those tests;
- 40 survived them and are killed here: the adapter's own model_type and vocabulary guards, the
  meta fields the simulator reads (tied embeddings, gated MLP), the explicit-softmax attention that
  H2O uses (its mask and its scaling: only the attention sums were checked, never its logits),
  `_init_random` (Gemma's zero norms, zero biases, the seed, Gemma's embedding scale, a tied
  lm_head), config.json's top-level rope_theta, a rope_theta of 0 and booleans as sizes, a tied
  directory without lm_head; `gguf:` with no path, a directory, `~`, rope.freq_base and an
  infinite eps, special ids of -1 and of the vocabulary's size, the load's shared reader given to
  another file, transformers' tqdm put back, `_eos_ids`, an installed package without its file;
  a checkpoint's info, eval mode, booleans as sizes, weights of other shapes under the same
  names, a preset's seed and `trained`, a solm config.json naming a model_type; the writer's own
  refusal of a folder that is not a trace, a refinement counted once, the minor columns partly at
  their default (NaN too), write_trace's cast and request count;
- 2 survive (and a third, below, led to a change): equivalent, gguf's `end > size` counting only the last tensor's offset (gguf 0.19's
  reader itself refuses every file whose tensor data is cut: it cannot reshape a short view, so no
  file reaches the check with a tensor past the end; tried at cuts of 1, 100 and 16000 bytes);
  equivalent, `_holds_default` keeping a minor column of an empty table (the file gains an empty
  column, the reader reads the same trace). The third, `table_from_rows` taking a minor column
  given by some rows only (the mutant raised a KeyError where the writer wrote the default for
  every row, dropping the values given), showed that the writer lost data silently on such rows;
  no engine writes them, and now they are refused like a row lacking a base column (a KeyError
  naming the column: a bug in the caller, exit 1), tested below.
No other bug found. The GGUF tests need the gguf package (`make real`) and skip without it, as test_gguf.py does."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from profiler.errors import UsageError
from runtime import gguf


# ---- runtime/gguf.py ----------------------------------------------------------------------------
@pytest.fixture
def gguf_pkg():
    return pytest.importorskip("gguf", reason="the gguf package is not installed (make real)")


def _write_llama(gguf_pkg, path, blocks: int = 2, tokens: list[str] | None = None, **extra) -> Path:
    """A llama GGUF of sound sizes holding the tensors of `blocks` blocks; `extra` (method name ->
    args) adds metadata, e.g. add_rope_freq_base=(0.0,)."""
    w = gguf_pkg.GGUFWriter(str(path), "llama")
    w.add_embedding_length(64)
    w.add_block_count(blocks)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    if tokens is not None:
        w.add_token_list(tokens)
    for method, args in extra.items():
        getattr(w, method)(*args)
    w.add_tensor("token_embd.weight", np.zeros((8, 64), dtype=np.float32))
    for i in range(blocks):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_gguf_spec_without_a_path_is_a_usage_error_not_a_missing_file():
    """`gguf:` alone (or `gguf:.`) names no file: the usage line, not "file '.' does not exist"."""
    for spec in ("gguf:", "gguf:."):
        with pytest.raises(UsageError, match="needs a path to a .gguf file") as e:
            gguf.resolve_spec(spec)
        assert not isinstance(e.value, gguf.ModelFileError)


def test_a_gguf_spec_naming_a_directory_is_not_a_file(tmp_path):
    with pytest.raises(gguf.ModelFileError, match="does not exist .or is not a file."):
        gguf.resolve_spec(f"gguf:{tmp_path}")


def test_a_gguf_path_with_a_tilde_is_in_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    assert gguf.resolve_spec("gguf:~/m.gguf") == tmp_path / "m.gguf"


@pytest.mark.parametrize(
    "extra,needle",
    [
        ({"add_rope_freq_base": (0.0,)}, "llama.rope.freq_base must be a finite number > 0, got 0.0"),
        ({"add_rope_freq_base": (float("nan"),)}, "llama.rope.freq_base must be a finite number > 0, got nan"),
        ({"add_layer_norm_rms_eps": (float("inf"),)}, "layer_norm_rms_epsilon must be a finite number > 0, got inf"),
    ],
)
def test_gguf_floats_that_cannot_be_a_model(gguf_pkg, tmp_path, extra, needle):
    p = _write_llama(gguf_pkg, tmp_path / "m.gguf", **extra)
    with pytest.raises(UsageError, match=re.escape(needle)):
        gguf.check_gguf(p)


@pytest.mark.parametrize(
    "extra,needle",
    [
        # an int32 -1: transformers would index the token list from its end (the last token as eos)
        ({"add_int32": ("tokenizer.ggml.eos_token_id", -1)}, "eos_token_id -1 is outside its vocabulary of 3"),
        ({"add_bos_token_id": (3,)}, "bos_token_id 3 is outside its vocabulary of 3"),  # one past the last
    ],
)
def test_special_ids_just_outside_the_vocabulary(gguf_pkg, tmp_path, extra, needle):
    p = _write_llama(gguf_pkg, tmp_path / "m.gguf", tokens=["a", "b", "c"], **extra)
    with pytest.raises(UsageError, match=re.escape(needle)):
        gguf.check_gguf(p)
    ok = _write_llama(gguf_pkg, tmp_path / "ok.gguf", tokens=["a", "b", "c"], add_bos_token_id=(2,))
    assert gguf.check_gguf(ok) == "llama"  # the last id is inside


def test_a_load_shares_the_reader_of_its_own_file_only(gguf_pkg, tmp_path):
    """While one file loads, `gguf.GGUFReader` of that file is the one shared reader; any other
    file still gets a reader of its own (was a mutant: every file got the loading file's reader)."""
    a = _write_llama(gguf_pkg, tmp_path / "a.gguf")
    b = _write_llama(gguf_pkg, tmp_path / "b.gguf", blocks=3)
    with gguf._one_parse(a):
        ra, rb = gguf_pkg.GGUFReader(a), gguf_pkg.GGUFReader(b)
        assert gguf_pkg.GGUFReader(a) is ra and rb is not ra
        assert len(rb.tensors) == 4 and len(ra.tensors) == 3


def test_the_quiet_bar_puts_transformers_tqdm_back():
    pytest.importorskip("transformers")
    import transformers.modeling_gguf_pytorch_utils as mod

    before = mod.tqdm
    with gguf._quiet_gguf_bar():
        assert mod.tqdm is not before
    assert mod.tqdm is before


def test_eos_ids_from_the_generation_config_else_the_model_config():
    def hf(gen, cfg):
        return SimpleNamespace(
            generation_config=SimpleNamespace(eos_token_id=gen), config=SimpleNamespace(eos_token_id=cfg)
        )

    assert gguf._eos_ids(hf(None, 7)) == (7,)  # the model config's when the generation config has none
    assert gguf._eos_ids(hf(5, 7)) == (5,)
    assert gguf._eos_ids(hf([1, 2], 7)) == (1, 2)
    assert gguf._eos_ids(hf(None, None)) == ()


def test_an_installed_package_without_its_file_says_reinstall(tmp_path, monkeypatch):
    """The package's installed-files list names the GGUF but the file is gone: one line, exit 2."""
    entry = SimpleNamespace(name=gguf.SMOLLM2_FILE)
    dist = SimpleNamespace(files=[entry], locate_file=lambda f: tmp_path / f.name)
    monkeypatch.setattr(gguf.metadata, "distribution", lambda name: dist)
    with pytest.raises(gguf.ModelFileError, match="is installed but SmolLM2-135M-Instruct.Q4_1.gguf is missing"):
        gguf.packaged_gguf()
    (tmp_path / gguf.SMOLLM2_FILE).write_bytes(b"GGUF")
    assert gguf.packaged_gguf() == tmp_path / gguf.SMOLLM2_FILE


# ---- runtime/hf_adapter.py ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def hf_adapter():
    return pytest.importorskip("runtime.hf_adapter", reason="transformers not installed (pip install 'solm[hf]')")


@pytest.fixture(scope="module")
def archs(hf_adapter):
    return {
        name: hf_adapter.build_arch(name, seed=1) for name in ("tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-gemma")
    }


def test_the_adapter_refuses_a_model_type_it_does_not_drive(hf_adapter):
    gpt2 = SimpleNamespace(config=SimpleNamespace(model_type="gpt2", vocab_size=100))
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported by the adapter"):
        hf_adapter.HFCausalLM(gpt2)


def test_a_vocabulary_exactly_the_tokenizers_is_enough(hf_adapter):
    assert hf_adapter.build_arch("tiny-llama", logits_vocab=384).logits_vocab == 384  # tiny-llama's own 384


def test_meta_extra_names_tied_embeddings_and_the_gated_mlp(archs):
    """`simulator.ModelSpec.from_trace_meta` counts a tied model's lm_head once and a gated MLP's
    three projections: both read from these fields."""
    qwen3, llama = archs["tiny-qwen3"].meta_extra(), archs["tiny-llama"].meta_extra()
    assert qwen3 == {"head_dim": 32, "tied_embeddings": True, "gated_mlp": True, "model_type": "qwen3"}
    assert llama["tied_embeddings"] is False and llama["head_dim"] == 16


@pytest.mark.parametrize("arch", ["tiny-llama", "tiny-qwen3"])
def test_logits_with_attention_returned_are_the_same_logits(archs, arch):
    """H2O asks for the attention weights: the explicit softmax that returns them computes the
    same attention as the fused kernel (scaled by 1/sqrt(head_dim), the model's `scaling`)."""
    from runtime.model import causal_mask

    m, T = archs[arch], 7
    toks = torch.randint(3, 300, (T,), generator=torch.Generator().manual_seed(0))
    kv = m.new_kv_store(page_size=4)
    slots = torch.tensor(kv.allocate(T))
    plain = m(toks, torch.arange(T), slots, causal_mask(T), kv)
    with_attention, _ = m(toks, torch.arange(T), slots, causal_mask(T), kv, return_attention=True)
    torch.testing.assert_close(with_attention, plain, atol=1e-5, rtol=1e-5)


def test_random_init_norms_at_identity_biases_zero_buffers_rebuilt(archs):
    """`_init_random`: RMSNorm weights 1 (Gemma's `1 + w` norms 0), Linear biases 0 (Qwen2's
    q/k/v), the rotary frequencies and Gemma's embedding scale rebuilt after `to_empty` (which
    left them as uninitialised memory), a tied lm_head the embedding itself."""
    for name, m in archs.items():
        norms = [
            mod.weight for mod in m.hf.modules() if type(mod).__name__.endswith("RMSNorm") and hasattr(mod, "weight")
        ]
        assert norms and all(bool((w == (0.0 if name == "tiny-gemma" else 1.0)).all()) for w in norms), name
        rot = m.hf.model.rotary_emb
        torch.testing.assert_close(rot.inv_freq, type(rot)(config=rot.config).inv_freq)
    biases = [
        mod.bias
        for mod in archs["tiny-qwen2"].hf.modules()
        if isinstance(mod, torch.nn.Linear) and mod.bias is not None
    ]
    assert biases and all(not b.any() for b in biases)
    gemma = archs["tiny-gemma"].hf.model.embed_tokens
    ids = torch.tensor([3, 5])
    torch.testing.assert_close(gemma(ids), gemma.weight[ids] * 64**0.5)
    for name in ("tiny-qwen3", "tiny-gemma"):  # tie_word_embeddings: true
        assert archs[name].hf.lm_head.weight is archs[name].hf.model.embed_tokens.weight
    assert archs["tiny-llama"].hf.lm_head.weight is not archs["tiny-llama"].hf.model.embed_tokens.weight


def test_random_weights_are_the_seeds(hf_adapter, archs):
    same, other = hf_adapter.build_arch("tiny-llama", seed=1), hf_adapter.build_arch("tiny-llama", seed=2)
    ref = archs["tiny-llama"].hf.state_dict()
    assert all(torch.equal(v, ref[k]) for k, v in same.hf.state_dict().items())
    assert not torch.equal(other.hf.lm_head.weight, ref["lm_head.weight"])


def _config_dir(tmp_path, arch: str = "tiny-llama", **change) -> Path:
    import json

    from runtime.hf_adapter import HF_CONFIGS_DIR

    doc = json.loads((HF_CONFIGS_DIR / f"{arch}.json").read_text())
    doc.update(change)
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(doc))
    return d


@pytest.mark.parametrize(
    "change,needle",
    [
        ({"rope_theta": float("nan")}, "rope_theta must be a finite number > 0, got nan"),
        (
            {"rope_parameters": {"rope_type": "default", "rope_theta": 0}},
            "rope_theta must be a finite number > 0, got 0",
        ),
        ({"num_hidden_layers": True}, "num_hidden_layers must be an integer in 1..16777216, got True"),
    ],
)
def test_a_local_config_that_cannot_be_a_model(hf_adapter, tmp_path, change, needle):
    with pytest.raises(UsageError, match=re.escape(needle)):
        hf_adapter._checked_hf_config(_config_dir(tmp_path, **change))


def test_a_tied_local_directory_needs_no_lm_head(archs, tmp_path):
    """A tied model's safetensors hold no lm_head.weight (the embedding's): it still loads."""
    from runtime.hf_adapter import load_hf_dir

    archs["tiny-qwen3"].hf.save_pretrained(tmp_path / "q3")
    m = load_hf_dir(tmp_path / "q3")
    assert m.hf.lm_head.weight is m.hf.model.embed_tokens.weight and m.cfg.model_type == "qwen3"


# ---- runtime/checkpoint.py ----------------------------------------------------------------------
@pytest.fixture
def ckpt(tmp_path):
    from runtime.checkpoint import save_checkpoint
    from runtime.model import ModelConfig, TinyLM

    return save_checkpoint(TinyLM(ModelConfig.from_name("tiny-2l"), seed=0), tmp_path / "ck", {"note": "n"})


def _edit(ckpt: Path, edit) -> None:
    import json

    doc = json.loads((ckpt / "config.json").read_text())
    edit(doc)
    (ckpt / "config.json").write_text(json.dumps(doc))


def test_a_checkpoint_without_its_weights_is_not_a_checkpoint(ckpt):
    from runtime.checkpoint import load_checkpoint

    (ckpt / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="is not a solm checkpoint .needs config.json and model.safetensors."):
        load_checkpoint(ckpt)


def test_a_loaded_checkpoint_is_in_eval_mode_and_its_info_a_dict(ckpt):
    from runtime.checkpoint import load_checkpoint

    model, info = load_checkpoint(ckpt)
    assert not model.training and info == {"note": "n"}
    _edit(ckpt, lambda d: d.__setitem__("info", ["not", "a", "dict"]))
    assert load_checkpoint(ckpt)[1] == {}


def test_weights_of_the_configs_names_but_other_shapes_are_refused(ckpt):
    """Same tensor names, another vocabulary: one line, not load_state_dict's RuntimeError (exit 1)."""
    from runtime.checkpoint import load_checkpoint

    _edit(ckpt, lambda d: d["config"].__setitem__("vocab_size", d["config"]["vocab_size"] + 1))
    with pytest.raises(UsageError, match="does not match .*: 2 tensors differ in name or shape .first embed.weight"):
        load_checkpoint(ckpt)


@pytest.mark.parametrize(
    "key,value,needle",
    [
        ("n_layers", True, "n_layers must be an integer in 1..1048576, got True"),  # JSON true is not 1 layer
        ("norm_eps", True, "norm_eps must be a number in"),
    ],
)
def test_a_boolean_is_not_a_config_number(key, value, needle):
    from runtime.checkpoint import _checked_config

    with pytest.raises(ValueError, match=re.escape(needle)):
        _checked_config({key: value})


def test_a_preset_is_random_weights_of_the_seed():
    from runtime.checkpoint import load_model

    (a, info), (b, _), (c, _) = (load_model("tiny-2l", seed=s) for s in (1, 1, 2))
    assert info == {"preset": "tiny-2l", "trained": False}
    assert torch.equal(a.embed.weight, b.embed.weight) and not torch.equal(a.embed.weight, c.embed.weight)


def test_gguf_alone_names_no_model_path(tmp_path, monkeypatch):
    """`--model gguf:` reads no file: not the working directory (an `--out` inside it would be refused)."""
    from runtime.checkpoint import model_path

    monkeypatch.chdir(tmp_path)
    assert model_path("gguf:") is None and model_path("gguf:.") == Path(".")


def test_which_specs_are_transformers_models(tmp_path, ckpt):
    from runtime.checkpoint import is_transformers_spec

    assert is_transformers_spec("arch:tiny-llama") and is_transformers_spec("gguf:x.gguf")
    assert not is_transformers_spec("tiny-2l") and not is_transformers_spec(str(ckpt))
    _edit(ckpt, lambda d: d.__setitem__("model_type", "llama"))  # a solm config.json (its "format") naming a type
    assert not is_transformers_spec(str(ckpt))


# ---- profiler/writer.py -------------------------------------------------------------------------
def _rows(rid: int):
    from tests.profiler.test_trace import _rows as rows

    return rows(rid)


def _tables(n: int = 2, **requests_columns) -> dict:
    """Whole tables of `n` requests (every column of the schema), some requests columns replaced."""
    from profiler.writer import table_from_rows

    rows = [_rows(i) for i in range(n)]
    tables = {
        "requests": table_from_rows("requests", [r[0] for r in rows]),
        "steps": table_from_rows("steps", [s for r in rows for s in r[1]]),
        "tokens": table_from_rows("tokens", [t for r in rows for t in r[2]]),
    }
    for name, values in requests_columns.items():
        t = tables["requests"]
        i = t.column_names.index(name)
        tables["requests"] = t.set_column(i, t.field(i), pa.array(values, type=t.field(i).type))
    return tables


def _meta() -> dict:
    from tests.profiler.test_trace import META

    return {**META, "kind": "simulated"}


@pytest.mark.parametrize(
    "column,values",
    [
        ("queue_s", [float("nan"), 1.5]),  # NaN is the default: one request's real value must stay
        ("preemptions", [0, 2]),
    ],
)
def test_a_minor_column_partly_at_its_default_is_written(tmp_path, column, values):
    """Only a column wholly at its default is left out (the reader fills it back): was a mutant,
    a column with any row at its default dropped, the other rows' values lost."""
    from profiler.reader import read_trace
    from profiler.writer import write_trace

    out = write_trace(tmp_path / "t", _meta(), _tables(**{column: values}), {})
    assert column in pq.read_schema(out / "requests.parquet").names
    assert read_trace(out).requests[column].tolist() == pytest.approx(values, nan_ok=True)


def test_rows_that_give_a_minor_column_in_some_rows_only_are_refused():
    """The values given are never dropped for the column's default (was: written as the default
    for every row, silently)."""
    from profiler.writer import table_from_rows

    steps = [s for s in _rows(0)[1]]
    assert len(steps) >= 2
    whole = [{**s, "recompute_tokens": 3} for s in steps]
    assert table_from_rows("steps", whole).column("recompute_tokens").to_pylist() == [3] * len(steps)
    mixed = [whole[0], *steps[1:]]
    with pytest.raises(KeyError, match=r"recompute_tokens.*in 1 of"):
        table_from_rows("steps", mixed)
    assert table_from_rows("steps", steps).column("recompute_tokens").to_pylist() == [0] * len(steps)


def test_table_slices_keep_a_minor_column_not_at_its_default_in_every_slice(tmp_path, monkeypatch):
    """A `TableSlices` table is checked slice by slice: a column at its default in the first
    slice but not in the second is kept."""
    import profiler.writer as writer
    from profiler.reader import read_trace

    monkeypatch.setattr(writer, "ROW_GROUP_ROWS", 1)
    whole = _tables(preemptions=[0, 3])
    req = whole["requests"]
    whole["requests"] = writer.TableSlices(
        writer.TABLES["requests"], 2, lambda cols, lo, hi: req.select(cols).slice(lo, hi - lo)
    )
    out = writer.write_trace(tmp_path / "t", _meta(), whole, {})
    names = pq.read_schema(out / "requests.parquet").names
    assert "preemptions" in names and "recompute_tokens" not in names  # the one at its default everywhere is left out
    assert read_trace(out).requests["preemptions"].tolist() == [0, 3]


def test_write_trace_casts_to_the_schema_and_counts_its_requests(tmp_path):
    import json

    from profiler.writer import write_trace

    tables = _tables(3)
    t = tables["requests"]
    i = t.column_names.index("steps")
    tables["requests"] = t.set_column(i, pa.field("steps", pa.int32()), t.column(i).cast(pa.int32()))
    out = write_trace(tmp_path / "t", _meta(), tables, {})
    assert pq.read_schema(out / "requests.parquet").field("steps").type == pa.int64()
    meta = json.loads((out / "meta.json").read_text())
    assert meta["n_requests"] == 3 and meta["complete"] is True


def test_counters_are_delta_encoded(tmp_path):
    """request_id, step_index, batch_index, token_index: DELTA_BINARY_PACKED (a few bits a row)."""
    from profiler.writer import write_trace

    out = write_trace(tmp_path / "t", _meta(), _tables(), {})
    md = pq.ParquetFile(out / "steps.parquet").metadata.row_group(0)
    enc = {md.column(i).path_in_schema: md.column(i).encodings for i in range(md.num_columns)}
    assert all("DELTA_BINARY_PACKED" in enc[c] for c in ("request_id", "step_index", "batch_index"))


def test_an_out_holding_only_the_lock_is_empty(tmp_path):
    from profiler.outdir import LOCK_NAME
    from profiler.writer import TraceWriter

    (tmp_path / "t").mkdir()
    (tmp_path / "t" / LOCK_NAME).write_text("")
    TraceWriter(tmp_path / "t", _meta())  # not "exists and is not empty"
    assert (tmp_path / "t" / "meta.json").is_file()


def test_a_request_written_twice_without_replace_is_refused(tmp_path):
    from profiler.writer import TraceWriter

    w = TraceWriter(tmp_path / "t", _meta())
    w.add_request(*_rows(0))
    with pytest.raises(ValueError, match="request 0 already written"):
        w.add_request(*_rows(0))


def test_a_refined_request_leaves_one_generation_and_counts_once(tmp_path):
    import json

    from profiler.writer import TraceWriter

    w = TraceWriter(tmp_path / "t", _meta())
    w.add_request(*_rows(0))
    w.add_request(*_rows(0), replace=True)
    w.add_request(*_rows(0), replace=True)
    assert sorted(p.name for p in (tmp_path / "t" / "parts").iterdir()) == [
        f"{kind}-00000000.g2.{ext}"
        for kind, ext in (("graph", "json"), ("request", "parquet"), ("steps", "parquet"), ("tokens", "parquet"))
    ]
    w.close()
    assert json.loads((tmp_path / "t" / "meta.json").read_text())["n_requests"] == 1


def test_close_keeps_the_counters_that_were_set(tmp_path):
    from profiler.counters import _row
    from profiler.reader import read_trace
    from profiler.writer import TraceWriter

    w = TraceWriter(tmp_path / "t", _meta())
    w.add_request(*_rows(0))
    w.set_counters([_row(0.0, "host", cpu_percent=25.0, rss_bytes=1e6)])  # the sampler's own row: GPU values NaN
    t = read_trace(w.close())
    assert t.complete and t.counters["cpu_percent"].tolist() == [25.0]


def test_overwrite_never_replaces_a_folder_that_is_not_a_trace(tmp_path):
    """`overwrite` (--force) empties only a trace solm wrote: a user's folder of Parquet files and
    a meta.json of their own is refused whole (was a mutant: the writer's own check dropped, its
    .parquet and meta.json removed; the commands check first, the writer must not rely on it)."""
    import json

    from profiler.writer import OutputExists, TraceWriter, write_trace

    d = tmp_path / "mine"
    d.mkdir()
    (d / "requests.parquet").write_bytes(b"user data")
    (d / "meta.json").write_text(json.dumps({"kind": "notes"}))
    for write in (lambda: TraceWriter(d, _meta(), overwrite=True), lambda: write_trace(d, _meta(), _tables(), {})):
        with pytest.raises(OutputExists, match="is not a trace solm wrote; refusing to replace it"):
            write()
        assert (d / "requests.parquet").read_bytes() == b"user data" and json.loads((d / "meta.json").read_text()) == {
            "kind": "notes"
        }
