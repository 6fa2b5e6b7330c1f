"""Mutation-round tests of runtime/kv.py: behaviour test_model_kv.py did not pin (each kills a
hand-made mutant that survived it: a new page's K/V zeroed, free's byte count over pages, a request's
exact fit and foreign slots, a readmission's owners and page count, attention_mask's shape checks
and padding). All on a 1-layer toy layout, no model."""

from __future__ import annotations

import pytest
import torch

from profiler.errors import KVPoolFull
from runtime.kv import KVLayout, PagedKVStore, RequestKV, attention_mask

LAYOUT = KVLayout(n_layers=1, n_kv_heads=1, head_dim=2)


def store(page_size: int = 2, max_pages: int | None = None) -> PagedKVStore:
    return PagedKVStore(LAYOUT, page_size=page_size, max_pages=max_pages)


def test_a_reused_page_starts_zeroed():
    """A released page's id is taken again with its K/V cleared, not the dead tokens' values."""
    kv = store()
    a = kv.allocate(2, owner="a")
    kv.write(0, torch.tensor(a), torch.ones(2, 1, 2), torch.full((2, 1, 2), 2.0))
    k, v = kv.keys_values(0)
    assert bool((k[:, a] == 1).all()) and bool((v[:, a] == 2).all())
    assert kv.free(a) == kv.page_bytes
    b = kv.allocate(2, owner="b")
    assert b == a  # the same page id, reused
    k, v = kv.keys_values(0)
    assert not k[:, b].any() and not v[:, b].any()


def test_free_counts_every_page_it_releases():
    kv = store()
    slots = kv.allocate(5)  # pages 0, 1 full, page 2 holds one
    assert kv.free(slots) == 3 * kv.page_bytes
    assert kv.pages_held == 0 and kv.bytes_allocated == 0


def test_a_request_may_take_exactly_the_free_pages():
    kv = store(page_size=4, max_pages=2)
    req = RequestKV(kv, request_id=1)
    assert len(req.allocate(8)) == 8 and kv.pages_held == 2
    other = RequestKV(kv, request_id=2)
    with pytest.raises(KVPoolFull, match="KV pool full"):
        other.allocate(1)


def test_a_request_never_frees_another_requests_slots():
    kv = store(page_size=2)
    a, b = RequestKV(kv, 1), RequestKV(kv, 2)
    sa, sb = a.allocate(2), b.allocate(2)
    assert a.free(sb) == 0  # not a's: nothing happens
    assert b.live == set(sb) and kv.live_tokens == 4 and kv.pages_held == 2
    assert a.free(sa + sb) == kv.page_bytes  # only a's page goes
    assert b.live_tokens == 2 and kv.pages_held == 1


def test_pages_for_owners_counts_each_owners_tokens():
    req = RequestKV(store(page_size=4), request_id=3)
    assert req.pages_for_owners(["p"] * 5) == 2
    assert req.pages_for_owners(["p"] * 4 + ["q"]) == 2
    assert req.pages_for_owners([]) == 0


def test_a_readmission_fills_each_owners_pages_and_may_take_exactly_the_free_ones():
    kv = store(page_size=2, max_pages=2)
    req = RequestKV(kv, request_id=4)
    slots = req.allocate_replay([10, 11, 12], ["a", "b", "a"])
    assert slots == [0, 2, 1]  # a's two tokens share a page, b's lies in its own
    assert kv.pages_held == 2 and req.live_tokens == 3
    req.release()
    assert len(req.allocate_replay([1, 2, 3, 4], ["a", "a", "b", "b"])) == 4
    with pytest.raises(KVPoolFull, match="cannot be readmitted"):
        RequestKV(kv, request_id=5).allocate_replay([1], ["c"])


def test_attention_mask_checks_rows_and_reach_and_pads_a_narrow_visibility():
    kv = store(page_size=2)
    kv.allocate(4)  # slots 0..3, S = 4
    dev = torch.device("cpu")
    with pytest.raises(ValueError, match="N=2"):  # one row for two queries is refused, not broadcast
        attention_mask(torch.ones(1, 4, dtype=torch.bool), 2, kv, dev)
    wide = torch.zeros(1, 6, dtype=torch.bool)
    wide[0, 0] = wide[0, 5] = True
    with pytest.raises(KeyError, match="beyond"):
        attention_mask(wide, 1, kv, dev)
    wide[0, 5] = False  # columns past S that are all False are cut off
    assert attention_mask(wide, 1, kv, dev).shape == (1, 1, 1, 4)
    narrow = torch.tensor([[True, False], [True, True]])
    mask = attention_mask(narrow, 2, kv, dev)
    assert mask.shape == (1, 1, 2, 4)
    assert mask[0, 0].tolist() == [[True, False, False, False], [True, True, False, False]]


def test_a_slot_named_twice_is_freed_once():
    """Was (a bug): `free([s, s])` counted s off its page twice, so the request held no page under
    its other live token, and freeing that token raised KeyError."""
    kv = store(page_size=2)
    req = RequestKV(kv, request_id=6)
    s = req.allocate(2)
    assert req.free([s[0], s[0]]) == 0
    assert (req.live_tokens, req.pages_held, kv.live_tokens, kv.pages_held) == (1, 1, 1, 1)
    assert req.free([s[1]]) == kv.page_bytes and req.pages_held == 0 and kv.pages_held == 0
