"""Every attention strategy (`SOLM_SDPA`, runtime/attention.py) is the same function of its inputs:
PyTorch's own choice, shapes padded to powers of two, the memory-efficient kernel over folded
heads, any backend but cuDNN's, and the math reference; a bad name is a usage error."""

from __future__ import annotations

import json

import pytest
import torch

import runtime.attention as attention
from profiler.errors import UsageError
from runtime.attention import SDPA_STRATEGIES, masked_sdpa, next_power_of_two, set_sdpa_strategy


@pytest.fixture
def strategy():
    """Set a strategy for one test; the environment's is read again after."""
    yield set_sdpa_strategy
    set_sdpa_strategy(None)


def inputs(n: int, s: int, heads: int = 4, kv_heads: int = 2, d: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, n, d, generator=g)
    K, V = torch.randn(1, kv_heads, s, d, generator=g), torch.randn(1, kv_heads, s, d, generator=g)
    mask = torch.rand(1, 1, n, s, generator=g) < 0.4
    mask[..., 0] = True  # every row sees a key
    return q, K, V, mask


def reference(q, K, V, mask, scale=None):
    """Softmax attention written out: grouped heads repeated, masked scores to -inf."""
    rep = q.shape[1] // K.shape[1]
    Kr, Vr = K.repeat_interleave(rep, dim=1), V.repeat_interleave(rep, dim=1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    w = ((q @ Kr.transpose(-1, -2)) * scale).masked_fill(~mask, float("-inf")).softmax(-1)
    return w @ Vr


@pytest.mark.parametrize("name", SDPA_STRATEGIES)
@pytest.mark.parametrize(("n", "s", "kv_heads"), [(5, 37, 2), (1, 16, 4), (8, 64, 1), (3, 100, 2)])
def test_every_strategy_is_the_same_attention(strategy, name, n, s, kv_heads):
    strategy(name)
    q, K, V, mask = inputs(n, s, kv_heads=kv_heads)
    for scale in (None, 0.3):
        got = masked_sdpa(q, K, V, mask, scale)
        assert got.shape == q.shape
        torch.testing.assert_close(got, reference(q, K, V, mask, scale), atol=1e-5, rtol=1e-5)


def test_bucket_pads_rows_and_keys_to_powers_of_two(strategy, monkeypatch):
    """The kernel sees 8 rows over 64 keys for 5 rows over 37; padded keys unseen, padded rows dropped."""
    seen = []
    sdpa = attention.F.scaled_dot_product_attention

    def spy(q, K, V, attn_mask, **kw):
        seen.append((q.shape[2], K.shape[2], tuple(attn_mask.shape), bool(attn_mask[..., :5, 37:].any())))
        seen.append(bool(attn_mask[..., 5:, :].all()))
        return sdpa(q, K, V, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    strategy("bucket")
    q, K, V, mask = inputs(5, 37)
    assert masked_sdpa(q, K, V, mask).shape == (1, 4, 5, 8)
    assert seen == [(8, 64, (1, 1, 8, 64), False), True]


def test_default_is_the_efficient_kernel_on_a_gpu_outside_torch_compile_and_pytorchs_choice_elsewhere():
    from runtime.attention import effective_strategy

    assert effective_strategy("default", cuda=True) == "efficient"
    assert effective_strategy("default", cuda=True, compiling=True) == "auto"
    assert effective_strategy("default", cuda=False) == "auto"
    for name in SDPA_STRATEGIES[1:]:  # every other strategy is itself, anywhere
        assert {effective_strategy(name, c, k) for c in (False, True) for k in (False, True)} == {name}


def test_no_strategy_copies_the_pools_keys_per_query_head(strategy, monkeypatch):
    """`default` on a CPU hands PyTorch the grouped heads as they are; `efficient` (whose kernel
    takes no grouped heads) folds each K, V head's 2 query heads into 2 x 5 query rows, so K and V,
    a view of the whole pool, are never expanded; only a mask with heads of its own expands them."""
    calls = []
    sdpa = attention.F.scaled_dot_product_attention

    def spy(q, K, V, attn_mask, **kw):
        calls.append((q.shape[1:3], K.shape[1], tuple(attn_mask.shape), kw.get("enable_gqa")))
        return sdpa(q, K, V, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    q, K, V, mask = inputs(5, 37)
    for name, expected in (
        ("default", ((4, 5), 2, (1, 1, 5, 37), True)),
        ("efficient", ((2, 10), 2, (1, 1, 10, 37), None)),
    ):
        strategy(name)
        masked_sdpa(q, K, V, mask)
        assert calls.pop() == expected
    per_head = mask.expand(1, 4, 5, 37).clone()  # a mask with a head dimension: K, V expanded
    got = masked_sdpa(q, K, V, per_head)
    assert calls.pop() == ((4, 5), 4, (1, 4, 5, 37), None)
    torch.testing.assert_close(got, reference(q, K, V, mask), atol=1e-5, rtol=1e-5)


def test_efficient_folds_the_heads_of_a_batch_of_sequences(strategy):
    """Training's dense forward runs B sequences with a (B, 1, T, T) mask: the folded heads are
    the same attention for each."""
    strategy("efficient")
    g = torch.Generator().manual_seed(1)
    q, K, V = (
        torch.randn(3, 6, 7, 8, generator=g),
        torch.randn(3, 2, 7, 8, generator=g),
        torch.randn(3, 2, 7, 8, generator=g),
    )
    mask = torch.rand(3, 1, 7, 7, generator=g) < 0.5
    mask[..., 0] = True
    torch.testing.assert_close(masked_sdpa(q, K, V, mask), reference(q, K, V, mask), atol=1e-5, rtol=1e-5)


def test_a_capture_records_the_strategy_it_ran(strategy):
    from profiler.counters import CounterSampler
    from runtime.capture import device_meta

    for name, recorded in (("default", "auto"), ("bucket", "bucket")):  # default on a CPU: PyTorch's choice
        strategy(name)
        assert device_meta("cpu", CounterSampler(1.0, origin=0.0, use_nvml=False))["sdpa"] == recorded


def test_next_power_of_two():
    assert [next_power_of_two(n) for n in (1, 2, 3, 4, 5, 16, 17, 1000, 1024)] == [1, 2, 4, 4, 8, 16, 32, 1024, 1024]


def test_the_strategy_is_read_from_the_environment_once_and_a_bad_one_is_a_usage_error(strategy, monkeypatch):
    monkeypatch.setenv("SOLM_SDPA", "math")
    assert strategy(None) == "math" and attention.sdpa_strategy() == "math"
    monkeypatch.setenv("SOLM_SDPA", "bucket")
    assert attention.sdpa_strategy() == "math"  # read once
    monkeypatch.setenv("SOLM_SDPA", "")
    assert strategy(None) == "default"
    monkeypatch.delenv("SOLM_SDPA")
    assert strategy(None) == "default"
    monkeypatch.setenv("SOLM_SDPA", "cudnn-please")
    with pytest.raises(
        UsageError, match="SOLM_SDPA='cudnn-please' is not an attention strategy; valid: default, auto, bucket"
    ):
        strategy(None)


@pytest.mark.parametrize("name", ["bucket", "efficient", "math"])
def test_the_paged_forward_gives_the_same_logits_under_each_strategy(strategy, tiny_model, name):
    """TinyLM's paged forward (mask and per-request gather) as under PyTorch's own choice."""
    from runtime.rows_sweep import decode_context, decode_rows
    from runtime.server import forward_batch

    out = {}
    for s in ("auto", name):
        strategy(s)
        for how in ("mask", "gather"):
            kv, context = decode_context(tiny_model, 16, 3, 50)
            logits, _, _ = forward_batch(tiny_model, kv, decode_rows(kv, context), how)
            out[s, how] = logits
    for how in ("mask", "gather"):
        torch.testing.assert_close(out[name, how], out["auto", how], atol=1e-4, rtol=1e-4)


def test_solm_capture_sdpa_flag_overrides_the_environment_and_is_recorded(strategy, tmp_path, monkeypatch, capsys):
    from solm.cli import main

    monkeypatch.setenv("SOLM_SDPA", "bucket")
    argv = ["capture", "--model", "tiny-2l", "--n", "1", "--max-tokens", "3"]
    assert main([*argv, "--sdpa", "math", "--out", str(tmp_path / "flag")]) == 0
    assert json.loads((tmp_path / "flag" / "meta.json").read_text())["device"]["sdpa"] == "math"
    assert main([*argv, "--out", str(tmp_path / "env")]) == 0  # no flag: SOLM_SDPA again
    assert json.loads((tmp_path / "env" / "meta.json").read_text())["device"]["sdpa"] == "bucket"
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main([*argv, "--sdpa", "cudnn", "--out", str(tmp_path / "bad")])
    assert e.value.code == 2 and "invalid choice: 'cudnn'" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_bucket_extends_a_pool_view_over_the_pools_own_slots_and_pads_anything_else(strategy, monkeypatch):
    """K, V as `PagedKVStore.keys_values` gives them (the first 37 of 64 slots of each head's
    rows): `bucket` attends over 64 of the pool's slots without a copy (the same storage), the
    slots past 37 hidden; a pool too small for the bucket, or a K of its own, is padded (a copy).
    Both give the reference attention."""
    seen = []
    sdpa = attention.F.scaled_dot_product_attention

    def spy(q, K, V, attn_mask, **kw):
        seen.append((K.shape[2], K.untyped_storage().data_ptr()))
        return sdpa(q, K, V, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    strategy("bucket")
    q, K, V, mask = inputs(5, 37)
    for capacity, shared in ((64, True), (48, False)):
        kpool, vpool = torch.zeros(2, capacity, 8), torch.zeros(2, capacity, 8)  # slots past 37: zeroed, masked
        kpool[:, :37], vpool[:, :37] = K[0], V[0]
        Kv, Vv = kpool[None, :, :37], vpool[None, :, :37]  # views, as keys_values gives them
        got = masked_sdpa(q, Kv, Vv, mask)
        torch.testing.assert_close(got, reference(q, K, V, mask), atol=1e-5, rtol=1e-5)
        span, ptr = seen.pop()
        assert span == 64 and (ptr == kpool.untyped_storage().data_ptr()) == shared
    masked_sdpa(q, K, V, mask)  # a K of its own (contiguous, 37 slots): padded
    span, ptr = seen.pop()
    assert span == 64 and ptr != K.untyped_storage().data_ptr()


@pytest.mark.parametrize(("n", "s", "kv_heads"), [(5, 37, 2), (1, 16, 4), (8, 64, 1)])
def test_weighted_attention_is_the_same_attention_and_sums_what_each_key_received(n, s, kv_heads):
    """H2O's explicit softmax: the output of every strategy, and per key the weights summed over
    heads and the selected rows (fp32 under bf16 too)."""
    q, K, V, mask = inputs(n, s, kv_heads=kv_heads)
    rows = torch.arange(n) % 2 == 0
    for scale in (None, 0.3):
        y, received = attention.weighted_attention(q, K, V, mask, scale, rows)
        torch.testing.assert_close(y, reference(q, K, V, mask, scale), atol=1e-5, rtol=1e-5)
        rep = q.shape[1] // K.shape[1]
        scale_ = q.shape[-1] ** -0.5 if scale is None else scale
        w = (
            ((q @ K.repeat_interleave(rep, dim=1).transpose(-1, -2)) * scale_)
            .masked_fill(~mask, float("-inf"))
            .softmax(-1)
        )
        expected = w[0][:, rows].sum(dim=(0, 1))[None]
        assert received.shape == (1, s)
        torch.testing.assert_close(received, expected, atol=1e-5, rtol=1e-5)
        assert float(received.sum()) == pytest.approx(
            q.shape[1] * int(rows.sum()), rel=1e-5
        )  # each row's weights sum to 1
        assert not received[~mask[0, 0][rows].any(0)[None]].any()  # a key no selected row may see received nothing
    _, every = attention.weighted_attention(q, K, V, mask)
    assert float(every.sum()) == pytest.approx(q.shape[1] * n, rel=1e-5)
    _, half = attention.weighted_attention(q.bfloat16(), K.bfloat16(), V.bfloat16(), mask)
    assert half.dtype == torch.float32


def test_tinylm_h2o_attention_is_its_fused_attention(tiny_model):
    """The same Block with and without the weights H2O reads: the same hidden states."""
    from runtime.model import rope_angles

    block, cfg = tiny_model.layers[0], tiny_model.cfg
    g = torch.Generator().manual_seed(3)
    T = 6
    x = torch.randn(1, T, cfg.d_model, generator=g)
    cos, sin = rope_angles(torch.arange(T)[None], cfg.head_dim, cfg.rope_theta)
    mask = torch.ones(T, T, dtype=torch.bool).tril()[None, None]

    def kv_fn(layer, k, v):  # no pool: the pass's own keys
        return k, v

    with torch.no_grad():
        fused = block(x, cos, sin, mask, kv_fn)
        received: list[torch.Tensor] = []
        weighted = block(x, cos, sin, mask, kv_fn, attn_out=received)
    torch.testing.assert_close(weighted, fused, atol=1e-5, rtol=1e-5)
    assert received[0].shape == (1, T)
    assert float(received[0].sum()) == pytest.approx(cfg.n_heads * T, rel=1e-5)
    assert float(received[0][0, 0]) > float(received[0][0, -1])  # every row sees the first key, one the last
