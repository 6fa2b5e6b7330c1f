"""Slot-addressed, paged KV store.

A *slot* is the address of one token's keys and values in every layer. Slots are grouped in pages
of `page_size`; slot `s` lives in page `s // page_size` at offset `s % page_size`. Engines choose
slots explicitly (`allocate(n)` hands out free ones, page by page), write K/V into them through
`TinyLM.forward`, and free them when a token dies (TIP, eviction baselines). A page whose slots
are all free is released: its page id goes back to a free list, `bytes_allocated` (whole pages
held) goes down, and the next page taken reuses the lowest free id, so a freed page's memory holds
new tokens (as vLLM's block manager does: freed blocks go back to the pool other sequences draw on).

Storage is one pool per K and V, indexed by slot, so a forward pass writes all its tokens with one
indexed copy per layer and reads keys as a view (no per-page gather):
    pool: (L, Hkv, C, D)   L layers, Hkv kv heads, C = capacity in slots, D head dim
With `max_pages` the pool is allocated once at that size (a fixed KV budget, as a serving engine
reserves it); without, it grows by doubling when a new page id passes its end (`bytes_reserved`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Hashable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, cast

import torch

from profiler.errors import KVPoolFull

# Visibility checks that read a device tensor back to the host (a sync per check on CUDA): always
# on CPU, where they cost nothing extra; on an accelerator only with SOLM_DEBUG=1.
DEBUG_CHECKS = os.environ.get("SOLM_DEBUG", "") not in ("", "0")


@dataclass(frozen=True)
class KVLayout:
    """Shape and dtype of the KV of one token; the simulator uses the same byte arithmetic."""

    n_layers: int
    n_kv_heads: int
    head_dim: int
    dtype: torch.dtype = torch.float32

    @cached_property
    def bytes_per_token(self) -> int:
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * elem


class PagedKVStore:
    """K/V for every layer, addressed by slot, allocated and freed in pages."""

    def __init__(
        self,
        layout: KVLayout,
        page_size: int = 16,
        device: str | torch.device = "cpu",
        max_pages: int | None = None,
    ) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.layout = layout
        self.page_size = page_size
        self.device = torch.device(device)
        self.max_pages = max_pages
        L, H, D = layout.n_layers, layout.n_kv_heads, layout.head_dim
        cap = (max_pages or 4) * page_size
        self._kpool = torch.zeros((L, H, cap, D), dtype=layout.dtype, device=self.device)
        self._vpool = torch.zeros((L, H, cap, D), dtype=layout.dtype, device=self.device)
        self._held = torch.zeros(cap, dtype=torch.bool, device=self.device)  # slot lies in a held page
        self._used: dict[int, set[int]] = {}  # page id held -> offsets holding a live token
        self._free_page_ids: list[int] = []
        self._next_page_id = 0
        self._open: dict[Hashable, list[int]] = {}  # owner -> [page that allocate() fills next, next offset]

    # ----------------------------------------------------------------- accounting
    @property
    def page_bytes(self) -> int:
        return self.layout.bytes_per_token * self.page_size

    @property
    def live_tokens(self) -> int:
        return sum(len(u) for u in self._used.values())

    @property
    def pages_held(self) -> int:
        return len(self._used)

    @property
    def bytes_allocated(self) -> int:
        """Bytes of K/V held by this store's pages (whole pages, live or not)."""
        return len(self._used) * self.page_bytes

    @property
    def bytes_reserved(self) -> int:
        """Bytes of the backing pool (>= bytes_allocated)."""
        return 2 * self._kpool.numel() * self._kpool.element_size()

    @property
    def num_slots(self) -> int:
        """Size of the slot address space (highest page id ever used + 1, times page size)."""
        return self._next_page_id * self.page_size

    # ----------------------------------------------------------------- allocation
    def _new_page(self) -> int:
        if self.max_pages is not None and len(self._used) >= self.max_pages:
            raise KVPoolFull(
                f"KV store full: {len(self._used)} pages of {self.page_size} slots held (max_pages={self.max_pages})"
            )
        page = self._free_page_ids.pop(0) if self._free_page_ids else self._next_page_id
        if page == self._next_page_id:
            self._next_page_id += 1
        P = self.page_size
        if (page + 1) * P > self._kpool.shape[2]:
            self._grow((page + 1) * P)
        self._kpool[:, :, page * P : (page + 1) * P] = 0
        self._vpool[:, :, page * P : (page + 1) * P] = 0
        self._held[page * P : (page + 1) * P] = True
        self._used[page] = set()
        return page

    def allocate(self, n: int, owner: Hashable = None) -> list[int]:
        """Hand out `n` fresh slots, filling the owner's open page before taking a new one.

        Each `owner` (a request, a request's prompt, ...) fills its own pages, so tokens that die
        together share pages and one owner's live tokens never pin another's freed page.
        """
        slots: list[int] = []
        for _ in range(n):
            cur = self._open.get(owner)
            if cur is None or cur[1] >= self.page_size or cur[0] not in self._used:
                cur = self._open[owner] = [self._new_page(), 0]
            slots.append(cur[0] * self.page_size + cur[1])
            self._used[cur[0]].add(cur[1])
            cur[1] += 1
        return slots

    def free(self, slots: list[int] | tuple[int, ...]) -> int:
        """Mark slots dead; release every page left with no live slot. Returns bytes released.

        The open page is released too once it is empty, so a freed page never lingers.
        """
        touched: set[int] = set()
        for s in slots:
            page, off = divmod(int(s), self.page_size)
            used = self._used.get(page)
            if used is not None and off in used:
                used.discard(off)
                touched.add(page)
        released = 0
        for page in sorted(touched):
            if not self._used[page]:
                released += self._release(page)
        return released

    def _grow(self, slots: int) -> None:
        cap = self._kpool.shape[2]
        while cap < slots:
            cap *= 2
        for name in ("_kpool", "_vpool"):
            old = getattr(self, name)
            new = torch.zeros((*old.shape[:2], cap, old.shape[3]), dtype=old.dtype, device=old.device)
            new[:, :, : old.shape[2]] = old
            setattr(self, name, new)
        held = torch.zeros(cap, dtype=torch.bool, device=self._held.device)
        held[: self._held.shape[0]] = self._held
        self._held = held

    def _release(self, page: int) -> int:
        nbytes = self.page_bytes
        del self._used[page]
        self._held[page * self.page_size : (page + 1) * self.page_size] = False
        self._free_page_ids.append(page)
        self._free_page_ids.sort()
        for owner in [o for o, cur in self._open.items() if cur[0] == page]:
            del self._open[owner]
        return nbytes

    # ----------------------------------------------------------------- read / write
    def check_slots(self, slots: list[int]) -> None:
        """Raise KeyError unless every slot lies in a held page (once per forward pass; a Python
        loop over host ints: ~1 us a pass, where a tensor check against `_held` costs ~20 us)."""
        P = self.page_size
        for s in slots:
            if int(s) // P not in self._used:
                raise KeyError(f"slot {int(s)} is not allocated (page {int(s) // P} is free)")

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v: (N, Hkv, D) for N tokens at `slots` (N,) in `layer` (one indexed copy each;
        the caller checks the slots with `check_slots` once per pass)."""
        self._kpool[layer][:, slots] = k.to(self.layout.dtype).transpose(0, 1)
        self._vpool[layer][:, slots] = v.to(self.layout.dtype).transpose(0, 1)

    def keys_values(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of K, V of every slot of `layer`: each (Hkv, num_slots, D); no copy. Slots of free
        pages hold stale values: attention masks them (`attention_mask`)."""
        S = self.num_slots
        return self._kpool[layer][:, :S], self._vpool[layer][:, :S]

    def perturb(self, slot: int, scale: float = 10.0) -> None:
        """Overwrite one slot's K/V with large noise (tests use it to prove visibility is real)."""
        g = torch.Generator().manual_seed(slot)
        for t in (self._kpool, self._vpool):
            noise = torch.randn(t[:, :, slot].shape, generator=g) * scale
            t[:, :, slot] = noise.to(t.dtype).to(t.device)


class RequestKV:
    """One request's share of a (possibly shared) store: it allocates under its own owners
    `(request_id, owner)`, so its pages hold only its tokens, and it counts its own live slots and
    pages (a server's pool holds many requests; a request alone has the store to itself)."""

    def __init__(self, store: PagedKVStore, request_id: int) -> None:
        self.store, self.rid = store, request_id
        self.live: set[int] = set()
        self._pages: dict[int, int] = {}  # page -> this request's live slots in it

    @property
    def live_tokens(self) -> int:
        return len(self.live)

    @property
    def pages_held(self) -> int:
        return len(self._pages)

    @property
    def bytes_allocated(self) -> int:
        return len(self._pages) * self.store.page_bytes

    @property
    def num_slots(self) -> int:
        return self.store.num_slots

    def allocate(self, n: int, owner: Hashable = None) -> list[int]:
        """`n` fresh slots (KVPoolFull from a full pool, with nothing taken)."""
        if self.store.max_pages is not None and self.pages_for(n, owner) > self.store.max_pages - self.store.pages_held:
            raise KVPoolFull(
                f"KV pool full: request {self.rid} needs {self.pages_for(n, owner)} more pages, "
                f"{self.store.max_pages - self.store.pages_held} free"
            )
        slots = self.store.allocate(n, owner=(self.rid, owner))
        P = self.store.page_size
        for s in slots:
            self.live.add(s)
            self._pages[s // P] = self._pages.get(s // P, 0) + 1
        return slots

    def free(self, slots) -> int:
        P = self.store.page_size
        # each slot once: a slot named twice was counted off its page twice (was: free([s, s])
        # left the request holding no page under a live token, and freeing that token: KeyError)
        mine = [s for s in dict.fromkeys(int(s) for s in slots) if s in self.live]
        for s in mine:
            self.live.discard(s)
            left = self._pages[s // P] - 1
            if left:
                self._pages[s // P] = left
            else:
                del self._pages[s // P]
        return self.store.free(mine)

    def release(self) -> int:
        """Free every slot this request holds. Bytes released."""
        return self.free(sorted(self.live))

    def pages_for(self, n: int, owner: Hashable = None) -> int:
        """New pages `allocate(n, owner)` would take (its owner's open page fills first)."""
        cur = self.store._open.get((self.rid, owner))
        room = 0
        if cur is not None and cur[0] in self.store._used and cur[1] < self.store.page_size:
            room = self.store.page_size - cur[1]
        return math.ceil(max(0, n - room) / self.store.page_size)

    def pages_for_owners(self, owners: list) -> int:
        counts: dict = {}
        for o in owners:
            counts[o] = counts.get(o, 0) + 1
        return sum(self.pages_for(n, o) for o, n in counts.items())

    def allocate_replay(self, ids: list[int], owners: list) -> list[int]:
        """One slot per held token, each under its owner, in order (a readmitted request)."""
        if (
            self.store.max_pages is not None
            and self.pages_for_owners(owners) > self.store.max_pages - self.store.pages_held
        ):
            raise KVPoolFull(f"KV pool full: request {self.rid} cannot be readmitted")
        return [self.allocate(1, o)[0] for o in owners]


class PagedKVModel:
    """What every model behind the one primitive shares about its KV (mixed into `TinyLM` and the
    transformers adapter): needs `self.cfg` (n_layers, n_kv_heads, head_dim) and `self.embed`."""

    if TYPE_CHECKING:  # what the model class it is mixed into provides (declared for mypy only)
        cfg: Any

    @property
    def kv_layout(self) -> KVLayout:
        return KVLayout(self.cfg.n_layers, self.cfg.n_kv_heads, self.cfg.head_dim, self._embedding.weight.dtype)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.kv_layout.bytes_per_token

    def num_parameters(self) -> int:
        return sum(p.numel() for p in cast(torch.nn.Module, self).parameters())  # mixed into an nn.Module

    def new_kv_store(self, page_size: int = 16, max_pages: int | None = None) -> PagedKVStore:
        return PagedKVStore(self.kv_layout, page_size, self._embedding.weight.device, max_pages)

    @property
    def _embedding(self) -> torch.nn.Embedding:
        """The model's token embedding: TinyLM's attribute, the transformers adapter's property."""
        return cast(Any, self).embed


def attention_row_sum(w: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """Attention weights (B, H, T, M) summed over heads and the query rows `rows` (T,) bool selects
    (None: every row): (B, M). Shared by every model behind the one primitive."""
    if rows is None:
        return w.sum(dim=(1, 2))
    return (w.sum(dim=1) * rows.to(w.dtype)[None, :, None]).sum(dim=1)


def attention_mask(visibility: torch.Tensor, n_queries: int, kv: PagedKVStore, device: torch.device) -> torch.Tensor:
    """The attention mask of a forward pass over every slot of `kv` (`keys_values`): (1, 1, N, S)
    bool. Checks `visibility` is (N, S') bool with S' <= S and at least one visible slot per row;
    a slot of a free page must never be visible. Shared by every model behind the one primitive."""
    N = n_queries
    if visibility.dim() != 2 or visibility.shape[0] != N:
        raise ValueError(f"visibility must be (N={N}, S) bool, got {tuple(visibility.shape)}")
    S = kv.num_slots
    check = DEBUG_CHECKS or visibility.device.type == "cpu"  # each check below is a host sync on a GPU
    if visibility.shape[1] > S:
        if check and bool(visibility[:, S:].any()):
            raise KeyError(f"visibility reaches slots beyond the store's {S}")
        visibility = visibility[:, :S]
    vis = visibility.to(device=device, dtype=torch.bool)
    if check and not bool(vis.any(dim=1).all()):
        raise ValueError("every query row must see at least one slot")
    if vis.shape[1] < S:
        vis = torch.cat([vis, vis.new_zeros((N, S - vis.shape[1]))], dim=1)
    if check:
        stale = vis & ~kv._held[:S]
        if bool(stale.any()):
            slot = int(stale.any(dim=0).nonzero()[0])
            raise KeyError(f"slot {slot} is not allocated (page {slot // kv.page_size} is free)")
    return vis[None, None]
