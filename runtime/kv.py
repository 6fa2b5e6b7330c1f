"""Slot-addressed, paged KV store.

A *slot* is the address of one token's keys and values in every layer. Slots are grouped in pages
of `page_size`; slot `s` lives in page `s // page_size` at offset `s % page_size`. Engines choose
slots explicitly (`allocate(n)` hands out free ones, page by page), write K/V into them through
`TinyLM.forward`, and free them when a token dies (TIP, eviction baselines). A page whose slots
are all free is released: its tensor is dropped, so `bytes_allocated` goes down for real, and its
page id goes back to a free list so later tokens reuse it.

Layout of one page (legend as in `runtime.model`):
    k, v: (L, Hkv, P, D)   L layers, Hkv kv heads, P = page_size slots, D head dim
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KVLayout:
    """Shape and dtype of the KV of one token; the simulator uses the same byte arithmetic."""

    n_layers: int
    n_kv_heads: int
    head_dim: int
    dtype: torch.dtype = torch.float32

    @property
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
        self._k: dict[int, torch.Tensor] = {}  # page id -> (L, Hkv, P, D)
        self._v: dict[int, torch.Tensor] = {}
        self._used: dict[int, set[int]] = {}  # page id -> offsets holding a live token
        self._free_page_ids: list[int] = []
        self._next_page_id = 0
        self._open: dict[Hashable, list[int]] = {}  # owner -> [page that allocate() fills next, next offset]
        self.pages_allocated_total = 0
        self.pages_freed_total = 0

    # ----------------------------------------------------------------- accounting
    @property
    def page_bytes(self) -> int:
        return self.layout.bytes_per_token * self.page_size

    @property
    def live_tokens(self) -> int:
        return sum(len(u) for u in self._used.values())

    @property
    def pages_held(self) -> int:
        return len(self._k)

    @property
    def bytes_allocated(self) -> int:
        """Bytes of K/V tensors actually held (whole pages, live or not)."""
        return sum(t.numel() * t.element_size() for t in self._k.values()) * 2

    @property
    def num_slots(self) -> int:
        """Size of the slot address space (highest page id ever used + 1, times page size)."""
        return self._next_page_id * self.page_size

    def is_live(self, slot: int) -> bool:
        page, off = divmod(slot, self.page_size)
        return off in self._used.get(page, ())

    def live_slots(self) -> list[int]:
        return sorted(p * self.page_size + o for p, used in self._used.items() for o in used)

    # ----------------------------------------------------------------- allocation
    def _new_page(self) -> int:
        if self.max_pages is not None and len(self._k) >= self.max_pages:
            raise MemoryError(
                f"KV store full: {len(self._k)} pages of {self.page_size} slots held (max_pages={self.max_pages})"
            )
        page = self._free_page_ids.pop(0) if self._free_page_ids else self._next_page_id
        if page == self._next_page_id:
            self._next_page_id += 1
        L, H, D = self.layout.n_layers, self.layout.n_kv_heads, self.layout.head_dim
        shape = (L, H, self.page_size, D)
        self._k[page] = torch.zeros(shape, dtype=self.layout.dtype, device=self.device)
        self._v[page] = torch.zeros(shape, dtype=self.layout.dtype, device=self.device)
        self._used[page] = set()
        self.pages_allocated_total += 1
        return page

    def allocate(self, n: int, owner: Hashable = None) -> list[int]:
        """Hand out `n` fresh slots, filling the owner's open page before taking a new one.

        Each `owner` (a request, a request's prompt, ...) fills its own pages, so tokens that die
        together share pages and one owner's live tokens never pin another's freed page.
        """
        slots: list[int] = []
        for _ in range(n):
            cur = self._open.get(owner)
            if cur is None or cur[1] >= self.page_size or cur[0] not in self._k:
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

    def _release(self, page: int) -> int:
        nbytes = self.page_bytes
        del self._k[page], self._v[page], self._used[page]
        self._free_page_ids.append(page)
        self._free_page_ids.sort()
        for owner in [o for o, cur in self._open.items() if cur[0] == page]:
            del self._open[owner]
        self.pages_freed_total += 1
        return nbytes

    def reset(self) -> None:
        for page in list(self._k):
            self._release(page)
        self._free_page_ids.clear()
        self._next_page_id = 0
        self._open.clear()

    # ----------------------------------------------------------------- read / write
    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v: (N, Hkv, D) for N tokens at `slots` (N,) in `layer`."""
        pages = slots // self.page_size
        offs = slots % self.page_size
        k, v = k.to(self.layout.dtype).transpose(0, 1), v.to(self.layout.dtype).transpose(0, 1)  # (Hkv, N, D)
        for p in pages.unique().tolist():  # one indexed copy per page, not per token
            if p not in self._k:
                bad = int(slots[pages == p][0])
                raise KeyError(f"slot {bad} is not allocated (page {p} is free)")
            sel = (pages == p).nonzero().flatten()
            o = offs[sel]
            self._k[p][layer][:, o] = k[:, sel]
            self._v[p][layer][:, o] = v[:, sel]

    def gather_pages(self, pages: list[int], layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of `pages` in `layer`, concatenated: each (Hkv, len(pages)*P, D)."""
        missing = [p for p in pages if p not in self._k]
        if missing:
            raise KeyError(f"pages {missing} are not allocated")
        k = torch.cat([self._k[p][layer] for p in pages], dim=1)
        v = torch.cat([self._v[p][layer] for p in pages], dim=1)
        return k, v

    def perturb(self, slot: int, scale: float = 10.0) -> None:
        """Overwrite one slot's K/V with large noise (tests use it to prove visibility is real)."""
        page, off = divmod(slot, self.page_size)
        g = torch.Generator().manual_seed(slot)
        for t in (self._k[page], self._v[page]):
            noise = torch.randn(t[:, :, off].shape, generator=g) * scale
            t[:, :, off] = noise.to(t.dtype).to(t.device)


class PagedKVModel:
    """What every model behind the one primitive shares about its KV (mixed into `TinyLM` and the
    transformers adapter): needs `self.cfg` (n_layers, n_kv_heads, head_dim) and `self.embed`."""

    @property
    def kv_layout(self) -> KVLayout:
        return KVLayout(self.cfg.n_layers, self.cfg.n_kv_heads, self.cfg.head_dim, self.embed.weight.dtype)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.kv_layout.bytes_per_token

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def new_kv_store(self, page_size: int = 16, max_pages: int | None = None) -> PagedKVStore:
        return PagedKVStore(self.kv_layout, page_size, self.embed.weight.device, max_pages)


def visible_pages(
    visibility: torch.Tensor, n_queries: int, kv: PagedKVStore, device: torch.device
) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """What a forward pass must gather: the pages any query row can see, their slot ids (M,), and
    the attention mask over those slots (1, 1, N, M). Checks `visibility` is (N, S) bool with at
    least one visible slot per row. Shared by every model behind the one primitive."""
    N = n_queries
    if visibility.dim() != 2 or visibility.shape[0] != N:
        raise ValueError(f"visibility must be (N={N}, S) bool, got {tuple(visibility.shape)}")
    if not bool(visibility.any(dim=1).all()):
        raise ValueError("every query row must see at least one slot")
    P = kv.page_size
    S = max(kv.num_slots, visibility.shape[1])
    vis = torch.zeros((N, S), dtype=torch.bool, device=device)
    vis[:, : visibility.shape[1]] = visibility.to(device)
    cols = vis.any(dim=0).nonzero().flatten()
    pages = sorted(set((cols // P).tolist()))
    page_slots = (torch.tensor(pages, device=device)[:, None] * P + torch.arange(P, device=device)).flatten()
    return pages, page_slots, vis[:, page_slots][None, None]

