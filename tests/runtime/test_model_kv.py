"""TinyLM on the slot-addressed KV store: cached decoding equals recomputation, visibility is real,
pages are freed and reused, checkpoints round-trip."""

from __future__ import annotations

import pytest
import torch

from profiler.errors import KVPoolFull
from runtime.engines.base import visibility_rows
from runtime.kv import KVLayout, PagedKVStore, RequestKV
from runtime.model import ModelConfig, TinyLM, causal_mask


def causal_rows(slots):
    return [slots[: i + 1] for i in range(len(slots))]


def test_cached_decode_matches_full_recompute(tiny_model, tok):
    m = tiny_model
    ids = tok.encode("reverse: abc,de")
    T = len(ids)
    full = m.forward_dense(torch.tensor([ids]), torch.arange(T)[None], causal_mask(T)[None])[0]
    kv = m.new_kv_store(page_size=3)
    # prefill the first 5 tokens, then decode one token at a time
    slots = kv.allocate(5)
    out = [
        m(
            torch.tensor(ids[:5]),
            torch.arange(5),
            torch.tensor(slots),
            visibility_rows(causal_rows(slots), kv.num_slots, "cpu"),
            kv,
        )
    ]
    for t in range(5, T):
        slots += kv.allocate(1)
        out.append(
            m(
                torch.tensor([ids[t]]),
                torch.tensor([t]),
                torch.tensor([slots[-1]]),
                visibility_rows([slots], kv.num_slots, "cpu"),
                kv,
            )
        )
    cached = torch.cat(out)
    assert torch.allclose(cached, full, atol=1e-4)
    assert torch.equal(cached.argmax(-1), full.argmax(-1))


def test_visibility_is_real(tiny_model, tok):
    m = tiny_model
    ids = tok.encode("hello world")
    T = len(ids)
    kv = m.new_kv_store(page_size=4)
    slots = kv.allocate(T)
    m(
        torch.tensor(ids),
        torch.arange(T),
        torch.tensor(slots),
        visibility_rows(causal_rows(slots), kv.num_slots, "cpu"),
        kv,
    )
    # a query at position T that sees every slot except slots[2]
    (q,) = kv.allocate(1)
    seen = [s for s in slots if s != slots[2]] + [q]

    def query():
        return m(
            torch.tensor([65]), torch.tensor([T]), torch.tensor([q]), visibility_rows([seen], kv.num_slots, "cpu"), kv
        )

    before = query()
    kv.perturb(slots[2])
    assert torch.allclose(query(), before, atol=1e-6), "a hidden slot changed the output"
    kv.perturb(slots[5])
    assert not torch.allclose(query(), before, atol=1e-3), "a visible slot did not change the output"


def test_freeing_pages_lowers_bytes_and_slots_are_reused(tiny_model):
    kv = tiny_model.new_kv_store(page_size=4)
    slots = kv.allocate(12)
    assert kv.live_tokens == 12 and kv.pages_held == 3
    held = kv.bytes_allocated
    assert held == 3 * kv.page_bytes
    # freeing part of a page lowers live tokens but not bytes
    assert kv.free(slots[:2]) == 0
    assert kv.live_tokens == 10 and kv.bytes_allocated == held
    # freeing the rest of the page releases it
    assert kv.free(slots[2:4]) == kv.page_bytes
    assert kv.bytes_allocated == held - kv.page_bytes and kv.live_tokens == 8
    # the freed page id is reused by the next allocation
    new = kv.allocate(4)
    assert sorted(new) == sorted(slots[:4])
    assert kv.bytes_allocated == held


def test_the_lowest_free_page_id_is_reused():
    """Two pages free (2, then 0): the next page taken is 0, the one after it 2."""
    kv = PagedKVStore(KVLayout(1, 1, 2), page_size=2)
    pages = {owner: kv.allocate(2, owner=owner) for owner in "abc"}
    assert [pages[o] for o in "abc"] == [[0, 1], [2, 3], [4, 5]]
    kv.free(pages["c"])
    kv.free(pages["a"])
    assert kv.allocate(1, owner="d") == [0]
    assert kv.allocate(1, owner="e") == [4]


def test_an_owner_whose_page_was_freed_never_writes_into_its_reuse():
    """Owner a's open page is released and taken by owner b: a's next slot lies in a new page,
    never at a's old offset in b's page."""
    kv = PagedKVStore(KVLayout(1, 1, 2), page_size=4)
    kv.free(kv.allocate(1, owner="a"))
    b = kv.allocate(2, owner="b")
    (a,) = kv.allocate(1, owner="a")
    assert b == [0, 1] and a // 4 == 1
    assert kv.live_tokens == 3 and kv.pages_held == 2


def test_request_kv_counts_the_pages_it_would_take_and_holds():
    """A request's share of a 3-page pool of 4-slot pages: its open page's room fills first, a
    pass that cannot fit takes nothing, and freeing a page's last slot gives the page back."""
    store = PagedKVStore(KVLayout(1, 1, 2), page_size=4, max_pages=3)
    req = RequestKV(store, request_id=7)
    first = req.allocate(1)
    assert [req.pages_for(n) for n in (3, 4, 5, 7, 8)] == [0, 1, 1, 1, 2]
    assert req.pages_for(1, owner="other") == 1
    rest = req.allocate(7)
    assert (req.pages_held, req.live_tokens, store.pages_held) == (2, 8, 2)
    with pytest.raises(KVPoolFull):  # 5 slots need 2 pages, 1 is free: nothing is taken
        req.allocate(5)
    assert (store.pages_held, store.live_tokens, req.live_tokens) == (2, 8, 8)
    req.free(first)
    assert req.pages_held == 2
    req.free(rest[:3])
    assert req.pages_held == 1 and store.pages_held == 1
    assert req.release() == store.page_bytes and req.pages_held == 0 and store.pages_held == 0


def test_store_capacity_and_bad_slots(tiny_model):
    kv = tiny_model.new_kv_store(page_size=2, max_pages=2)
    kv.allocate(4)
    with pytest.raises(KVPoolFull):  # the pool's own signal, not a MemoryError (a real OOM is a bug)
        kv.allocate(1)
    with pytest.raises(ValueError):
        tiny_model.new_kv_store(page_size=0)


def test_pool_grows_keeps_values_and_free_slots_are_never_visible(tiny_model, tok):
    """The slot-indexed pool doubles as pages pass its end, keeping what was written; a fixed
    budget never grows; attending to a slot of a released page or writing into one is refused."""
    m = tiny_model
    kv = m.new_kv_store(page_size=4)
    reserved = kv.bytes_reserved
    ids = tok.encode("abcdefghijklmnopqrstuvwx")  # 24 tokens: 6 pages, past the initial 4
    T = len(ids)
    slots = kv.allocate(T)
    out = m(
        torch.tensor(ids),
        torch.arange(T),
        torch.tensor(slots),
        visibility_rows(causal_rows(slots), kv.num_slots, "cpu"),
        kv,
    )
    assert kv.bytes_reserved > reserved and kv.bytes_allocated == 6 * kv.page_bytes
    full = m.forward_dense(torch.tensor([ids]), torch.arange(T)[None], causal_mask(T)[None])[0]
    assert torch.allclose(out, full, atol=1e-4)
    # free the first page: its slots may no longer be seen or written
    assert kv.free(slots[:4]) == kv.page_bytes
    (q,) = kv.allocate(1, owner="q")
    assert q in slots[:4]  # the lowest free page id is reused...
    assert kv.free([q]) == kv.page_bytes  # ...and released again once empty
    with pytest.raises(KeyError, match="not allocated"):
        m(
            torch.tensor([1]),
            torch.tensor([T]),
            torch.tensor([slots[-1]]),
            visibility_rows([slots], kv.num_slots, "cpu"),
            kv,
        )
    with pytest.raises(KeyError, match="not allocated"):
        m(
            torch.tensor([1]),
            torch.tensor([T]),
            torch.tensor([slots[0]]),
            visibility_rows([slots[4:]], kv.num_slots, "cpu"),
            kv,
        )
    fixed = m.new_kv_store(page_size=4, max_pages=3)
    fixed.allocate(12)
    assert fixed.bytes_reserved == 3 * fixed.page_bytes


def test_every_query_must_see_something(tiny_model):
    kv = tiny_model.new_kv_store()
    (s,) = kv.allocate(1)
    with pytest.raises(ValueError):
        tiny_model(
            torch.tensor([1]),
            torch.tensor([0]),
            torch.tensor([s]),
            torch.zeros((1, kv.num_slots), dtype=torch.bool),
            kv,
        )


def test_deterministic_init_and_checkpoint_roundtrip(tmp_path):
    from runtime.checkpoint import load_checkpoint, load_model, save_checkpoint

    a = TinyLM(ModelConfig.from_name("tiny-2l"), seed=7)
    b = TinyLM(ModelConfig.from_name("tiny-2l"), seed=7)
    c = TinyLM(ModelConfig.from_name("tiny-2l"), seed=8)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.embed.weight, c.embed.weight)
    save_checkpoint(a, tmp_path / "ck", {"note": "test"})
    assert not list((tmp_path / "ck").glob("*.pt")) and not list((tmp_path / "ck").glob("*.bin"))
    loaded, info = load_checkpoint(tmp_path / "ck")
    assert info == {"note": "test"}
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), loaded.state_dict().values()))
    with pytest.raises(FileNotFoundError, match="preset"):
        load_model("no-such-model")
    with pytest.raises(KeyError, match="tiny-4l"):
        ModelConfig.from_name("huge")


def test_attention_weights_exposed(tiny_model, tok):
    m = tiny_model
    kv = m.new_kv_store(page_size=4)
    slots = kv.allocate(6)
    logits, per_slot = m(
        torch.tensor(tok.encode("abcdef")),
        torch.arange(6),
        torch.tensor(slots),
        visibility_rows(causal_rows(slots), kv.num_slots, "cpu"),
        kv,
        return_attention=True,
    )
    plain = m(
        torch.tensor(tok.encode("abcdef")),
        torch.arange(6),
        torch.tensor(slots),
        visibility_rows(causal_rows(slots), kv.num_slots, "cpu"),
        kv,
    )
    assert torch.allclose(logits, plain, atol=1e-5)
    # each of 6 rows distributes weight 1 per head per layer
    cfg = m.cfg
    assert per_slot.sum().item() == pytest.approx(6 * cfg.n_heads * cfg.n_layers, rel=1e-4)


def test_attention_rows_limit_the_sum_to_those_rows(tiny_model, tok):
    """`attention_rows` sums the attention of the rows it selects only (a server leaves out a
    recompute's replayed rows, scored when they first ran): the selected and the other rows add up
    to every row's, each row gives weight 1 per head per layer, and a causal prompt's last slot is
    seen by its own row alone. Through the per-request gather (groups) alike."""
    from runtime.model import Group

    m, cfg = tiny_model, tiny_model.cfg
    kv = m.new_kv_store(page_size=4)
    slots = kv.allocate(6)
    ids, pos = torch.tensor(tok.encode("abcdef")), torch.arange(6)
    vis = visibility_rows(causal_rows(slots), kv.num_slots, "cpu")
    pick = torch.tensor([True, False, True, True, False, False])
    cols = torch.tensor(slots)
    group = [Group(0, 6, cols, vis[:, cols][None, None], True)]
    for kw in ({"visibility": vis}, {"visibility": None, "groups": group}):
        v = kw.pop("visibility")

        def run(rows, v=v, kw=kw):
            return m(ids, pos, torch.tensor(slots), v, kv, return_attention=True, attention_rows=rows, **kw)[1]

        every, some, rest = run(None), run(pick), run(~pick)
        torch.testing.assert_close(some + rest, every, atol=1e-4, rtol=1e-4)
        assert some.sum().item() == pytest.approx(3 * cfg.n_heads * cfg.n_layers, rel=1e-4)
        assert some[slots[-1]].item() == 0 and rest[slots[-1]].item() > 0
        torch.testing.assert_close(run(torch.ones(6, dtype=torch.bool)), every)
