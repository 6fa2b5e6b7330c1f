"""The server's per-request gather (`attention="gather"`) through the transformers adapter: each
request's rows attend to its own slots only, with the model's own score scale, and give the logits
the whole-pool mask gives; served requests give the same tokens either way. (Was: "attention=
'gather' needs a model with per-request gathers (TinyLM)" for every real-scale architecture, so
bench/gpu_run.sh could not compare the two on a GPU.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers", reason="transformers not installed (pip install 'solm[hf]')")

from runtime.checkpoint import load_model  # noqa: E402
from runtime.engines import GenerationConfig, Request, SequentialEngine  # noqa: E402
from runtime.engines.base import PassInputs  # noqa: E402
from runtime.hf_adapter import build_arch  # noqa: E402
from runtime.server import FakeClock, Server, forward_batch  # noqa: E402
from runtime.tokenizer import Tokenizer  # noqa: E402
from scheduling import get_scheduler  # noqa: E402

ARCHS = ["tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-gemma"]


def _pass(ids: list[int], positions: list[int], slots: list[int], cols: list[int], vis: np.ndarray) -> PassInputs:
    return PassInputs(ids, positions, slots, np.asarray(cols, dtype=np.int64), vis, "prefill")


def _two_requests(store) -> tuple[list[PassInputs], list[PassInputs]]:
    """A prefill of 5 and one of 3 tokens in one pass, then one decode row each; their slots
    interleaved in the pool (so a row seeing another request's slot would change its logits)."""
    a, b = store.allocate(6), store.allocate(4)
    gen = np.random.default_rng(0)
    ta, tb = gen.integers(3, 300, 6).tolist(), gen.integers(3, 300, 4).tolist()
    prefill = [
        _pass(ta[:5], list(range(5)), a[:5], a[:5], np.tril(np.ones((5, 5), bool))),
        _pass(tb[:3], list(range(3)), b[:3], b[:3], np.tril(np.ones((3, 3), bool))),
    ]
    decode = [
        _pass(ta[5:], [5], a[5:], a, np.ones((1, 6), bool)),
        _pass(tb[3:], [3], b[3:], b, np.ones((1, 4), bool)),
    ]
    return prefill, decode


@pytest.mark.parametrize("arch", ARCHS)
def test_gather_gives_the_masks_logits_and_attention(arch):
    model = build_arch(arch, seed=1)
    assert model.supports_groups
    store = model.new_kv_store(page_size=2)
    prefill, decode = _two_requests(store)
    for inputs in (prefill, decode):  # the same slots rewritten with the same K/V: same store after
        for inp in inputs:
            inp.attention = True
        masked, attn_masked, _ = forward_batch(model, store, inputs, "mask")
        gathered, attn_gathered, scored = forward_batch(model, store, inputs, "gather")
        torch.testing.assert_close(gathered, masked, atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(attn_gathered, attn_masked[: attn_gathered.shape[0]], atol=1e-4, rtol=1e-4)
        assert scored == [len(inp.ids) * len(inp.cols) for inp in inputs]  # its own slots, not the pool


def test_gather_sums_bf16_attention_in_fp32():
    """A bf16 model (the GPU's dtype): the per-slot attention H2O reads is summed in fp32 on both
    paths, and the gathered logits and sums agree with the mask's."""
    model = build_arch("tiny-llama", seed=1, dtype=torch.bfloat16)
    store = model.new_kv_store(page_size=2)
    prefill, _ = _two_requests(store)
    for inp in prefill:
        inp.attention = True
    masked, attn_masked, _ = forward_batch(model, store, prefill, "mask")
    gathered, attn_gathered, _ = forward_batch(model, store, prefill, "gather")
    assert attn_gathered.dtype == torch.float32
    torch.testing.assert_close(gathered, masked, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(attn_gathered, attn_masked[: attn_gathered.shape[0]], atol=1e-2, rtol=1e-2)


def test_gather_uses_the_models_own_score_scale():
    """Gemma scales scores by query_pre_attn_scalar ** -0.5, not head_dim ** -0.5: gathered logits
    match the mask's only with the module's own `scaling` (caught by changing it)."""
    model = build_arch("tiny-gemma", seed=1)
    store = model.new_kv_store(page_size=2)
    prefill, _ = _two_requests(store)
    masked = forward_batch(model, store, prefill, "mask")[0]
    for layer in model.hf.model.layers:
        layer.self_attn.scaling *= 2.0
    try:
        assert not torch.allclose(forward_batch(model, store, prefill, "gather")[0], masked, atol=1e-3)
    finally:
        for layer in model.hf.model.layers:
            layer.self_attn.scaling /= 2.0
    torch.testing.assert_close(forward_batch(model, store, prefill, "gather")[0], masked, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("arch", ["tiny-llama", "tiny-qwen2"])
def test_served_with_gather_equals_served_with_the_mask(arch):
    tok = Tokenizer()
    model, _ = load_model(f"arch:{arch}", seed=2)
    eng = SequentialEngine(model, tok, GenerationConfig(max_tokens=8, page_size=4))
    prompts = ["abc", "hello world", "a b c d e"]
    alone = [eng.generate(Request(i, p)).output_ids for i, p in enumerate(prompts)]
    runs = {}
    for attention in ("mask", "gather"):
        server = Server(
            eng,
            scheduler=get_scheduler("fcfs")(max_seqs=8, max_batch_tokens=512),
            clock=FakeClock(),
            max_pages=256,
            attention=attention,
        )
        out = server.serve([(0.0, p) for p in prompts])
        assert max(sum(not e.chunk for e in p.entries) for p in out["passes"]) == len(prompts)  # really batched
        runs[attention] = out
        assert [t.completion.output_ids for t in out["requests"]] == alone
    keys = {a: sum(p.attention_kv_tokens for p in out["passes"]) for a, out in runs.items()}
    assert keys["gather"] < keys["mask"]
