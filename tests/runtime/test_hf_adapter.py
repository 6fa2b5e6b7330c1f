"""The transformers adapter on tiny random Llama / Qwen2 / Qwen3 / Gemma configs (CPU, no download).

Parity with HF's own forward, cached decode through our store equals full recompute, the
sequential engine's greedy output equals HF greedy, eviction equals masking, and a PASTA thread
decoded among its siblings equals the same thread decoded alone on the adapter.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="transformers not installed (pip install 'solm[hf]')")

from runtime.checkpoint import load_model  # noqa: E402
from runtime.engines import GenerationConfig, Request, SequentialEngine, drain  # noqa: E402
from runtime.hf_adapter import build_arch  # noqa: E402
from runtime.model import causal_mask  # noqa: E402

ARCHS = ["tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-gemma"]


@pytest.fixture(scope="module")
def models():
    return {name: build_arch(name, seed=1) for name in ARCHS}


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 300, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch", ARCHS)
def test_adapter_logits_equal_hf_forward(models, arch):
    m, T = models[arch], 11
    toks = _ids(T)
    ref = m.hf(input_ids=toks[None]).logits[0].float()  # HF causal forward, no cache
    kv = m.new_kv_store(page_size=4)
    out = m(toks, torch.arange(T), torch.tensor(kv.allocate(T)), causal_mask(T), kv)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ["tiny-llama", "tiny-qwen2"])
def test_cached_decode_equals_full_recompute(models, arch):
    m, T, n0 = models[arch], 10, 6
    toks = _ids(T, seed=1)
    full = m.hf(input_ids=toks[None]).logits[0].float()
    kv = m.new_kv_store(page_size=4)
    slots = kv.allocate(n0)
    rows = [m(toks[:n0], torch.arange(n0), torch.tensor(slots), causal_mask(n0), kv)[-1]]
    for t in range(n0, T):
        slots.append(kv.allocate(1)[0])
        vis = torch.zeros((1, kv.num_slots), dtype=torch.bool)
        vis[0, slots] = True
        rows.append(m(toks[t : t + 1], torch.tensor([t]), torch.tensor(slots[-1:]), vis, kv)[0])
    torch.testing.assert_close(torch.stack(rows), full[n0 - 1 :], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ["tiny-llama", "tiny-qwen2"])
def test_sequential_engine_greedy_equals_hf_greedy(tok, arch):
    model, info = load_model(f"arch:{arch}", seed=2)
    assert info["trained"] is False and model.logits_vocab == tok.vocab_size
    c = SequentialEngine(model, tok, GenerationConfig(max_tokens=8, page_size=4)).generate(Request(0, "abc"))
    ids = [tok.bos_id, *tok.encode("abc"), tok.token_id("<sep>")]
    hf_out: list[int] = []
    for _ in range(len(c.output_ids)):  # HF's own forward over the whole sequence, greedy
        logits = model.hf(input_ids=torch.tensor([ids + hf_out])).logits[0, -1, : tok.vocab_size]
        hf_out.append(int(logits.argmax()))
    assert c.output_ids == hf_out


@pytest.mark.parametrize("arch", ["tiny-llama", "tiny-qwen2"])
def test_eviction_through_adapter_equals_masking(models, arch):
    m, n = models[arch], 8
    toks = _ids(n + 1, seed=3)

    def prefill():
        kv = m.new_kv_store(page_size=4)
        slots = kv.allocate(n)
        m(toks[:n], torch.arange(n), torch.tensor(slots), causal_mask(n), kv)
        return kv, slots

    kv_mask, slots = prefill()
    new = kv_mask.allocate(1)[0]
    vis = torch.zeros((1, kv_mask.num_slots), dtype=torch.bool)
    vis[0, [*slots[4:], new]] = True  # hide the first page
    masked = m(toks[n:], torch.tensor([n]), torch.tensor([new]), vis, kv_mask)

    kv_free, slots = prefill()
    before = kv_free.bytes_allocated
    released = kv_free.free(slots[:4])  # free the first page for real
    assert released > 0 and kv_free.bytes_allocated == before - released
    new = kv_free.allocate(1)[0]
    vis = torch.zeros((1, kv_free.num_slots), dtype=torch.bool)
    vis[0, [*slots[4:], new]] = True
    evicted = m(toks[n:], torch.tensor([n]), torch.tensor([new]), vis, kv_free)
    torch.testing.assert_close(evicted, masked, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("arch", ["tiny-llama", "tiny-qwen2"])
def test_pasta_thread_in_parallel_equals_thread_alone_on_adapter(tok, arch):
    pytest.importorskip("runtime.engines.pasta", reason="PASTA engine not present")
    from tests.runtime.test_pasta_engine import assert_thread_in_parallel_equals_thread_alone

    model, _ = load_model(f"arch:{arch}", seed=3)
    assert_thread_in_parallel_equals_thread_alone(model, tok, chunk=6)


def test_arch_spec_errors_and_meta(tok):
    with pytest.raises(FileNotFoundError, match="unknown architecture"):
        load_model("arch:nope-1b")
    from runtime.capture import model_meta

    model, info = load_model("arch:tiny-qwen3")
    meta = model_meta(model, "arch:tiny-qwen3", info)
    assert meta["n_layers"] == 2 and meta["trained"] is False and meta["params"] == model.num_parameters()
    assert meta["kv_bytes_per_token"] == 2 * 2 * 2 * 32 * 4  # K and V, 2 layers, 2 kv heads, head_dim 32, fp32


@pytest.mark.parametrize("system", ["sequential", "tip", "pasta", "planned_diffusion"])
def test_structure_replay_on_adapter_reproduces_reference_structure(tok, tmp_path, system):
    """A trained tiny model's trace replayed on a random Llama: same streams, positions, evictions,
    passes and live KV (token ids too, except Planned Diffusion's span contents, which the model denoises)."""
    import pandas as pd

    from runtime.capture import CaptureConfig, capture
    from runtime.checkpoint import CHECKPOINTS_DIR
    from runtime.engines import get_engine
    from runtime.structure_replay import Replayer, read_scripts

    if not (CHECKPOINTS_DIR / get_engine(system).default_model).is_dir():
        pytest.skip(f"shipped checkpoint for {system} not present")
    # Planned Diffusion with a confidence threshold (its shipped operating point) stops denoising a
    # span when the model is confident: a replay's denoise passes are then the new model's own. The
    # structure (plan, spans, rounds, denoise passes) is the reference's with a fixed step count.
    knobs = {"confidence_threshold": None} if system == "planned_diffusion" else {}
    ref = capture(
        CaptureConfig(system=system, n=1, max_tokens=24, page_size=4, knobs=knobs), tmp_path / system, progress=False
    )
    model, _ = load_model("arch:tiny-llama", seed=0)
    (script,) = read_scripts(ref)
    rp = Replayer(system, model, tok, GenerationConfig(max_tokens=24, page_size=4), **knobs)
    steps, c = drain(rp.run(Request(0, script.prompt), script))
    toks = pd.read_parquet(ref / "tokens.parquet").sort_values("token_index")
    ref_steps = pd.read_parquet(ref / "steps.parquet")
    for col in ("stream", "position_id", "evicted_at_step"):
        assert [getattr(t, col) for t in c.tokens] == toks[col].tolist(), col
    if system != "planned_diffusion":
        assert c.output_ids == toks.token_id.tolist() and [t.kind for t in c.tokens] == toks.kind.tolist()
    else:  # span contents are the model's: a span slot may hold [PAD] in one and text in the other
        fill = lambda k: "content" if k == "pad" else k  # noqa: E731
        assert [fill(t.kind) for t in c.tokens] == [fill(k) for k in toks.kind]
    assert [s.phase for s in steps] == ref_steps.phase.tolist()
    assert [s.live_kv_tokens for s in steps] == ref_steps.live_kv_tokens.tolist()


def test_local_hf_directory_loads_through_load_model(models, tmp_path, tok):
    src = models["tiny-qwen2"]
    src.hf.save_pretrained(tmp_path / "qwen-dir")  # config.json + model.safetensors, as a user's local model
    model, info = load_model(str(tmp_path / "qwen-dir"))
    assert info["trained"] is True and model.cfg.model_type == "qwen2" and model.logits_vocab == tok.vocab_size
    T = 7
    toks = _ids(T, seed=5)
    kv_a, kv_b = src.new_kv_store(4), model.new_kv_store(4)
    a = src(toks, torch.arange(T), torch.tensor(kv_a.allocate(T)), causal_mask(T), kv_a)
    b = model(toks, torch.arange(T), torch.tensor(kv_b.allocate(T)), causal_mask(T), kv_b)
    torch.testing.assert_close(b, a[:, : tok.vocab_size])


def test_an_arch_name_is_a_catalog_name_not_a_path():
    """Was: `arch:../hf_configs/tiny-llama` built the model of a file reached by its path."""
    from profiler.errors import UnknownName

    with pytest.raises(UnknownName, match="unknown architecture '../hf_configs/tiny-llama'"):
        build_arch("../hf_configs/tiny-llama")


def test_model_vocab_smaller_than_the_tokenizer_is_one_clear_error(tok):
    from runtime import hf_adapter

    with pytest.raises(ValueError, match="smaller than the tokenizer's"):
        hf_adapter.build_arch("tiny-llama", "cpu", seed=0, logits_vocab=10_000)
    assert (
        hf_adapter.build_arch("tiny-llama", "cpu", seed=0, logits_vocab=tok.vocab_size).logits_vocab == tok.vocab_size
    )


def _edit_config(d, **change) -> None:
    import json

    doc = json.loads((d / "config.json").read_text())
    doc.update(change)
    (d / "config.json").write_text(json.dumps(doc))


def _drop_tensor(d) -> None:
    from safetensors.torch import load_file, save_file

    weights = load_file(str(d / "model.safetensors"))
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, str(d / "model.safetensors"), metadata={"format": "pt"})


def _nan_tensor(d) -> None:
    from safetensors.torch import load_file, save_file

    weights = load_file(str(d / "model.safetensors"))
    weights["model.norm.weight"][3] = float("nan")
    save_file(weights, str(d / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize(
    "damage,needle",
    [
        # was: exit 0, every output from NaN logits
        (lambda d: _edit_config(d, rms_norm_eps=float("nan")), "rms_norm_eps must be a finite number > 0, got nan"),
        (lambda d: _edit_config(d, rope_parameters={"rope_theta": -1.0}), "rope_theta must be a finite number > 0"),
        (_nan_tensor, "tensor model.norm.weight holds NaN or infinite values"),
        # was: a GPT-2 built and loaded (its load report on stderr) before the adapter refused it
        (lambda d: _edit_config(d, model_type="gpt2"), "model_type 'gpt2' is not supported by the adapter"),
        # was: StrictDataclassClassValidationError / StrictDataclassFieldValidationError (exit 1)
        (lambda d: _edit_config(d, hidden_size=-1), "hidden_size must be an integer in 1..16777216, got -1"),
        (lambda d: _edit_config(d, hidden_size="4"), "hidden_size must be an integer in 1..16777216, got '4'"),
        (lambda d: _edit_config(d, num_attention_heads=3), "not a usable llama config"),
        # was: RuntimeError "ignore_mismatched_sizes" (exit 1)
        (lambda d: _edit_config(d, hidden_size=32, head_dim=8), "weights do not match config.json"),
        # was: exit 0, the missing tensor randomly initialised (a warning on stderr)
        (_drop_tensor, "first model.layers.1.mlp.up_proj.weight: None in the weights"),
    ],
)
def test_a_broken_local_hf_directory_is_one_line(damage, needle, tmp_path, capsys):
    from solm.cli import main

    build_arch("tiny-llama", seed=0).hf.save_pretrained(tmp_path / "hf")
    damage(tmp_path / "hf")
    capsys.readouterr()  # save_pretrained's own progress bar
    assert (
        main(
            ["capture", "--model", str(tmp_path / "hf"), "--n", "1", "--max-tokens", "2", "--out", str(tmp_path / "o")]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("solm capture: error: ") and err.count("\n") == 1 and needle in err, err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("arch", ["tiny-llama", "tiny-qwen3"])
def test_adapter_attention_rows_limit_the_sum_to_those_rows(models, arch):
    """H2O's attention through the adapter: the rows `attention_rows` selects and the others add up
    to every row's, each row giving weight 1 per head per layer."""
    m, T = models[arch], 7
    kv = m.new_kv_store(page_size=4)
    slots = torch.tensor(kv.allocate(T))
    pick = torch.arange(T) % 3 == 0

    def run(rows):
        return m(_ids(T), torch.arange(T), slots, causal_mask(T), kv, return_attention=True, attention_rows=rows)[1]

    every, some, rest = run(None), run(pick), run(~pick)
    torch.testing.assert_close(some + rest, every, atol=1e-4, rtol=1e-4)
    heads = m.hf.config.num_attention_heads * m.hf.config.num_hidden_layers
    assert some.sum().item() == pytest.approx(int(pick.sum()) * heads, rel=1e-4)
