"""What the diffusion engines and the Planned Diffusion training recipe share: the laid-out sequence,
the hybrid attention pattern over it, and the per-span unmasking rule.

**The hybrid attention pattern** (`hybrid_mask`) is the one definition of who sees whom. Training
builds its (T, T) mask with it; the engines ask it for the rows of each forward pass and map its
columns to KV slots, so the model is run with exactly the visibility it was trained under
(tests/runtime/test_pd_mask.py checks the two agree token for token). A sequence is a list of
segments: `ar` (prompt, plan entries, free text), `sync` (a `<sync/>` token) and `span`
(`<async>` + span tokens + `</async>`). Consecutive spans form a *round*. Then, after the official
code's training masks (planned-diffusion/planned-diffusion, train/attention_mask_v2.py and _v3.py):

- an `ar`/`sync` token sees every earlier `ar`/`sync` token (causal) and a span only once a
  `<sync/>` at or before it follows that span;
- a span token sees its whole span (bidirectional) and everything before its round;
- sibling spans of the round are blind to each other (PD-SA, `block_sparse=True`) or see each
  other fully (PD, `block_sparse=False`).

Positions are plain: a token's position id is its index in the laid-out sequence.

**Unmasking** (`unmask`): per span and step, the masked positions' predictions are ranked by the
unmasking order (`max_prob`, `entropy`: negative entropy, `margin`: top-1 minus top-2
probability) and the top k are committed, k from the schedule of the official `block_unmask`
(timesteps linspace(1, eps, steps + 1); k = max(1, floor(masks_left x (1 - s/t))), everything on
the last step). With steps = longest span (steps_ratio 1.0) every span commits one token a step
and finishes at the step equal to its length. With a confidence threshold (Fast-dLLM style), k
is also at least the number of predictions whose probability reaches the threshold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from profiler.errors import UsageError
from runtime.engines.base import PassInputs, RequestState
from runtime.kv import RequestKV
from runtime.sampling import Sampler

SEG_KINDS = ("ar", "sync", "span")
ORDERS = ("max_prob", "entropy", "margin")
EPS = 1e-3  # smallest timestep of the schedule (official default)


@dataclass(frozen=True)
class Seg:
    kind: str  # ar, sync, span
    length: int

    def __post_init__(self) -> None:
        if self.kind not in SEG_KINDS:
            raise ValueError(f"segment kind must be one of {SEG_KINDS}, got {self.kind!r}")
        if self.length < 1:
            raise ValueError(f"segment length must be >= 1, got {self.length}")


def token_roles(segs: list[Seg]) -> dict[str, torch.Tensor]:
    """Per-token arrays (T,): is_span, span id (-1 for AR), round id (-1 for AR), start of the
    token's round, and `reveal`: index of the first `<sync/>` after a span (T when none).
    Worked out per segment (a handful), then spread over tokens."""
    starts, span, rnd, rstart = [], [], [], []
    t = n_span = n_round = 0
    prev = ""
    for s in segs:
        starts.append(t)
        if s.kind == "span":
            if prev != "span":
                n_round += 1
                cur_start = t
            n_span += 1
        span.append(n_span - 1 if s.kind == "span" else -1)
        rnd.append(n_round - 1 if s.kind == "span" else -1)
        rstart.append(cur_start if s.kind == "span" else 0)
        t, prev = t + s.length, s.kind
    reveal, nxt = [t] * len(segs), t
    for i in range(len(segs) - 1, -1, -1):
        reveal[i] = nxt
        if segs[i].kind == "sync":
            nxt = starts[i]
    lengths = torch.tensor([s.length for s in segs])
    spread = lambda xs: torch.tensor(xs, dtype=torch.long).repeat_interleave(lengths)  # noqa: E731
    return {
        "is_span": spread(span) >= 0,
        "span": spread(span),
        "round": spread(rnd),
        "round_start": spread(rstart),
        "reveal": spread(reveal),
    }


def hybrid_mask(
    segs: list[Seg], block_sparse: bool = True, rows: list[int] | torch.Tensor | None = None
) -> torch.Tensor:
    """Bool (R, T): row r (token `rows[r]`, default every token) may attend to column k."""
    roles = token_roles(segs)
    T = roles["is_span"].shape[0]
    q = torch.arange(T) if rows is None else torch.as_tensor(rows, dtype=torch.long)
    k = torch.arange(T)[None, :]  # (1, T)
    qc = q[:, None]  # (R, 1)
    is_span, span, rnd = roles["is_span"], roles["span"], roles["round"]
    ar_vis = (k <= qc) & (~is_span[None, :] | (roles["reveal"][None, :] <= qc))
    span_vis = (k < roles["round_start"][q][:, None]) | (span[None, :] == span[q][:, None])
    if not block_sparse:
        span_vis = span_vis | (is_span[None, :] & (rnd[None, :] == rnd[q][:, None]))
    return torch.where(is_span[q][:, None], span_vis, ar_vis)


class Layout:
    """The laid-out sequence of one request: token ids, segments, and the KV slot of each token.

    `append` lays tokens out; `inputs(rows)` gives a slot to every token that has none yet (in
    order) and the pass over `rows` at their plain positions, writing their K/V into their slots
    (again, for span tokens: a slot is rewritten each denoising step), each row seeing the slots
    `hybrid_mask` allows."""

    def __init__(self, max_positions: int, kv: RequestKV, block_sparse: bool = True) -> None:
        self.max_positions, self.kv, self.block_sparse = max_positions, kv, block_sparse
        self.ids: list[int] = []
        self.segs: list[Seg] = []
        self.slots: list[int] = []  # the first len(slots) tokens have one

    def __len__(self) -> int:
        return len(self.ids)

    def append(self, kind: str, ids: list[int]) -> range:
        """Add tokens as a new segment (an `ar` run right after another `ar` run is merged)."""
        if not ids:
            return range(len(self.ids), len(self.ids))
        # a scaffold longer than the model's positions (`--knob length=5000`): the user's setting, one
        # line (was: ValueError, reported as a bug)
        if len(self.ids) + len(ids) > self.max_positions:
            raise UsageError(
                f"sequence of {len(self.ids) + len(ids)} tokens exceeds the model's {self.max_positions} positions"
            )
        start = len(self.ids)
        if kind == "ar" and self.segs and self.segs[-1].kind == "ar":
            self.segs[-1] = Seg("ar", self.segs[-1].length + len(ids))
        else:
            self.segs.append(Seg(kind, len(ids)))
        self.ids += ids
        return range(start, len(self.ids))

    @property
    def unassigned(self) -> int:
        return len(self.ids) - len(self.slots)

    def inputs(self, rows: list[int], phase: str, upto: int | None = None) -> PassInputs:
        """The pass over `rows`, giving slots to the first `upto` tokens (default all) if they have
        none (KVPoolFull, with nothing taken, when they do not fit the pool)."""
        upto = len(self.ids) if upto is None else upto
        if upto > len(self.slots):
            self.slots += self.kv.allocate(upto - len(self.slots))
        vis = hybrid_mask(self.segs, self.block_sparse, rows).numpy()[:, : len(self.slots)]  # (R, T)
        return PassInputs(
            [self.ids[r] for r in rows],
            list(rows),
            [self.slots[r] for r in rows],
            np.asarray(self.slots, dtype=np.int64),
            vis,
            phase,
        )


def recomputed_tail(lay: Layout, next_rows: list[int]) -> int:
    """Where a replay after a preemption may stop: the first of the trailing slotted rows that the
    next pass computes anyway (their K/V are written by that pass before anything reads them),
    provided no earlier row sees them; `len(lay.slots)` (replay everything) otherwise."""
    k = len(lay.slots)
    rows = set(next_rows)
    start = k
    while start > 0 and start - 1 in rows:
        start -= 1
    if 0 < start < k and hybrid_mask(lay.segs, lay.block_sparse, list(range(start))).numpy()[:, start:k].any():
        return k
    return start


class LaidOutState(RequestState):
    """A request state whose tokens live in a `Layout` (`self.lay`) and whose next pass's
    rows are `pass_rows()`: a replay re-feeds every slotted token, each seeing what `hybrid_mask`
    lets it see, except the trailing rows the next pass recomputes anyway (a denoising round's
    spans), which give up their slots at the preemption and take new ones with that pass."""

    lay: Layout

    def pass_rows(self) -> list[int]:
        raise NotImplementedError

    def next_rows(self) -> int:
        return len(self.pass_rows())

    def next_new_slots(self) -> dict:
        return {None: self.lay.unassigned}  # the tokens laid out since the last pass (or a preemption)

    def preempted(self) -> None:
        super().preempted()
        self.lay.slots = self.lay.slots[: recomputed_tail(self.lay, self.pass_rows())]

    def held(self) -> list[tuple[int, int, np.ndarray]]:
        k = len(self.lay.slots)
        vis = hybrid_mask(self.lay.segs, self.lay.block_sparse, list(range(k))).numpy()[:, :k]
        return [(self.lay.ids[r], r, np.flatnonzero(vis[r])) for r in range(k)]

    def remap(self, new_slots: list[int]) -> None:
        self.lay.slots = list(new_slots)


def steps_for(longest: int, steps_ratio: float) -> int:
    return max(1, int(round(longest * steps_ratio)))


def scheduled(masks_left: int, i: int, steps: int) -> int:
    """Tokens a span commits at step i of `steps` (the official block_unmask schedule)."""
    if i >= steps - 1:
        return masks_left
    t = 1 - i * (1 - EPS) / steps
    s = 1 - (i + 1) * (1 - EPS) / steps
    return min(masks_left, max(1, int(masks_left * (1 - s / t))))


def order_scores(probs: torch.Tensor, chosen: torch.Tensor, order: str) -> torch.Tensor:
    """Higher = unmask first. probs (R, V), chosen (R,) -> (R,)."""
    if order == "max_prob":
        return probs.gather(-1, chosen[:, None])[:, 0]
    if order == "entropy":
        return (probs * torch.log(probs + 1e-10)).sum(-1)
    if order == "margin":
        top2 = probs.topk(2, dim=-1).values
        return top2[:, 0] - top2[:, 1]
    raise ValueError(f"unmasking order must be one of {ORDERS}, got {order!r}")


def unmask(
    logits: torch.Tensor, sampler: Sampler, order: str, k: int, threshold: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One span's step. logits (R, V) at its masked positions -> (token ids (R,), commit (R,) bool)."""
    logits = logits.float().cpu()
    probs = logits.softmax(-1)
    chosen = sampler(logits)  # (R,)
    if threshold:
        confident = int((probs.gather(-1, chosen[:, None])[:, 0] >= threshold).sum())
        k = max(k, confident)
    k = max(1, min(k, logits.shape[0]))
    commit = torch.zeros(logits.shape[0], dtype=torch.bool)
    commit[order_scores(probs, chosen, order).topk(k).indices] = True
    return chosen, commit


def check_knobs(steps_ratio: float, order: str, threshold: float | None, length_scale: float) -> None:
    if not steps_ratio > 0 or math.isinf(steps_ratio):
        raise ValueError(f"steps_ratio must be > 0, got {steps_ratio}")
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    if threshold is not None and not 0.0 <= threshold <= 1.0:
        raise ValueError(f"confidence_threshold must be in [0, 1] (or null for none), got {threshold}")
    if not length_scale > 0:
        raise ValueError(f"length_scale must be > 0, got {length_scale}")


@dataclass
class SpanState:
    """One span being denoised: its stream id, its rows in the layout (tags included), the rows
    still masked, and for each unmasked row the denoising step (0-based, within the round)."""

    sid: int
    rows: range
    masked: list[int]
    unmasked_at: dict[int, int]
    finished_at: int = -1  # denoising steps the span took (1-based); -1 while active
    fresh: list[int] | None = None  # rows whose K/V are stale (committed in the last step); None = all

    def rows_to_compute(self, cache_committed: bool) -> list[int]:
        if not cache_committed or self.fresh is None:
            return list(self.rows)
        return sorted({*self.masked, *self.fresh})

    @property
    def length(self) -> int:
        return len(self.rows) - 2


def scaffold(lay: Layout, sid: int, length: int, tag_ids: tuple[int, int], mask_id: int) -> SpanState:
    rows = lay.append("span", [tag_ids[0], *[mask_id] * length, tag_ids[1]])
    return SpanState(sid, rows, list(rows[1:-1]), {})


class Denoiser:
    """Denoise `spans` together, one forward pass per step over every active span (plus `refresh`
    rows: spans finished in the step before, whose K/V still hold a [MASK]): `rows()` of the next
    pass, `after(logits)` -> a dict describing the pass; once `finished`, `refresh` holds the rows
    left to refresh (spans that finished in the last pass).

    `cache_committed` (an approximation, in the spirit of Fast-dLLM's cache): a committed token is
    recomputed once with its final id, then its K/V are kept while the rest of its span changes;
    each pass computes only masked rows and rows committed in the pass before."""

    def __init__(
        self,
        lay: Layout,
        spans: list[SpanState],
        steps: int,
        sample: Sampler,
        order: str,
        threshold: float | None,
        refresh: list[int],
        recompute_all: bool = False,
        cache_committed: bool = False,
    ) -> None:
        self.lay, self.spans, self.steps, self.sample = lay, spans, steps, sample
        self.order, self.threshold, self.refresh = order, threshold, refresh
        self.recompute_all, self.cache_committed = recompute_all, cache_committed
        self.i = 0
        self._rows: list[int] = []

    @property
    def finished(self) -> bool:
        return not any(s.masked for s in self.spans)

    def rows(self) -> list[int]:
        active = [s for s in self.spans if s.masked]
        self._rows = (
            list(range(len(self.lay)))
            if self.recompute_all
            else sorted({*self.refresh, *(r for s in active for r in s.rows_to_compute(self.cache_committed))})
        )
        return self._rows

    def after(self, logits: torch.Tensor, read: int) -> dict:
        active = [s for s in self.spans if s.masked]
        at = {r: j for j, r in enumerate(self._rows)}
        refresh, emitted, unmasked = [], [], {}
        i, lay = self.i, self.lay
        for s in active:
            ids, commit = unmask(
                logits[[at[p] for p in s.masked]],
                self.sample,
                self.order,
                scheduled(len(s.masked), i, self.steps),
                self.threshold,
            )
            keep, s.fresh = [], []
            for p, t, c in zip(s.masked, ids.tolist(), commit.tolist()):
                if c:
                    lay.ids[p] = t
                    s.unmasked_at[p] = i
                    emitted.append(t)
                    s.fresh.append(p)
                else:
                    keep.append(p)
            unmasked[s.sid] = len(s.masked) - len(keep)
            s.masked = keep
            if not keep:
                s.finished_at = i + 1
                refresh += s.fresh if self.cache_committed else list(s.rows)
        self.refresh, self.i = refresh, i + 1
        return {
            "i": i,
            "rows": len(self._rows),
            "kv_read": read,
            "streams": tuple(s.sid for s in active),
            "emitted": tuple(emitted),
            "masks_left": {s.sid: len(s.masked) for s in active},
            "unmasked": unmasked,
        }
