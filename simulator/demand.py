"""A request's next forward pass as the replay schedules it: whole, a prefill chunk, or a recompute.

What: `next_demand` turns the replay's per-request state (passes done, prefill tokens already
computed in earlier chunks, whether the request was preempted) into the demand of the pass each
request runs next: query tokens, KV slots read, streams, logit rows, pages held after it, tokens
emitted. Three cases beyond a plain pass of the workload:

- Chunked prefill (vLLM's default): a prompt prefill wider than what is left of the batched-token
  budget runs as several chunks; a chunk of rows [a, a + t) of a causal prefill of F rows reads
  the share (c(a + t) - c(a)) / c(F) of its KV slots, c(x) = x (x + 1) / 2; it emits nothing
  (vLLM v1 samples its last row and drops the token: one logit row); only the last chunk emits
  the pass's tokens. Other passes (decodes, thread
  passes, diffusion denoise steps) are never split.
- Recompute after preemption (vLLM's RECOMPUTE): the readmitted request's next pass carries, on
  top of its own rows, a causal re-prefill of the live KV it held (its tokens so far); that
  combined pass is a prefill (may be chunked) and emits what the pass emits. A prefill preempted
  between chunks restarts; its chunks already done are lost. Every token computed a second time
  (the re-prefill, the lost chunks run again) is recorded as `rebuild` and is not new demand: the
  workload's pass list is unchanged.
- Pages: a chunk holds the share of the pass's pages its rows reached (whole pages).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from simulator.workload import PHASE_CODE

PREFILL = PHASE_CODE["prefill"]


class Demand(NamedTuple):
    """The next pass of each request asked about (arrays aligned with the ids)."""

    query: np.ndarray  # query tokens it runs now
    kv_read: np.ndarray  # KV slots those rows read
    groups: np.ndarray  # streams with a query row
    logits: np.ndarray  # rows that need logits (a chunk that is not the last: 1, sampled and dropped, as vLLM v1)
    blocks: np.ndarray  # pages held after it
    live: np.ndarray  # live KV tokens after it
    emits: np.ndarray  # output tokens it produces
    rebuild: np.ndarray  # tokens of it that recompute KV lost to a preemption (not new demand)
    final: np.ndarray  # bool: it completes the workload pass (else a chunk, more to come)
    flat: np.ndarray  # flat workload index of the pass it belongs to


def _causal(x: np.ndarray) -> np.ndarray:
    return x * (x + 1) // 2


def next_demand(sim, rs, limit=None) -> Demand:
    """Demand of each request's next pass; `limit` (per id) caps a (re-)prefill to a chunk."""
    rs = np.asarray(rs, np.int64)
    idx = sim.off[rs] + sim.ptr[rs]
    if sim.all_usual(rs) and (limit is None or (np.asarray(limit) >= sim.w.query_tokens[idx]).all()):
        return _recorded_passes(sim, idx)
    return _partial_demand(sim, rs, idx, limit)


def _recorded_passes(sim, idx: np.ndarray) -> Demand:
    """The workload's passes `idx` as recorded: no chunk, no recompute (the common case, no arithmetic)."""
    w, n = sim.w, len(idx)
    return Demand(
        w.query_tokens[idx],
        w.kv_tokens_read[idx],
        w.query_groups[idx],
        w.logit_tokens[idx],
        sim.blocks[idx],
        w.live_kv_tokens[idx],
        w.emits[idx],
        np.zeros(n, np.int64),
        np.ones(n, bool),
        idx,
    )


def _partial_demand(sim, rs: np.ndarray, idx: np.ndarray, limit) -> Demand:
    """Requests `rs` whose next pass `idx` carries a re-prefill or runs as a chunk (module docstring)."""
    w = sim.w
    prev = np.maximum(idx - 1, 0)
    rc = sim.recompute[rs]
    has_prev = (sim.ptr[rs] > 0) & ~rc  # holds the KV of its last pass (not freed by a preemption)
    rebuild = np.where(rc, w.live_kv_tokens[prev], 0)
    full = w.query_tokens[idx] + rebuild
    done = sim.chunk_done[rs]
    redo = sim.redo[rs]  # the pass's first `redo` tokens were computed before and lost to a preemption
    left = full - done
    chunkable = rc | (w.phase[idx] == PREFILL)
    run = left if limit is None else np.where(chunkable, np.minimum(left, np.maximum(np.asarray(limit), 0)), left)
    final = run == left
    upto = done + run
    share = np.where(full > 0, upto / np.maximum(full, 1), 1.0)
    blocks, live = _held_after(sim, idx, prev, has_prev, final, share)
    kv_full = w.kv_tokens_read[idx] + _causal(rebuild)
    whole = (done == 0) & final
    frac = (_causal(upto) - _causal(done)) / np.maximum(_causal(full), 1)
    kv = np.where(whole, kv_full, np.round(kv_full * frac).astype(np.int64))
    return Demand(
        query=run,
        kv_read=kv,
        # a re-prefill whose own pass has no rows left (all of it was re-prefill) still runs one group, one logit
        groups=np.where(final, np.maximum(w.query_groups[idx], 1), 1),
        logits=np.where(final, np.maximum(w.logit_tokens[idx], 1), 1),
        blocks=blocks,
        live=live,
        emits=np.where(final, w.emits[idx], 0),
        rebuild=np.minimum(upto, redo) - np.minimum(done, redo),
        final=final,
        flat=idx,
    )


def _held_after(sim, idx, prev, has_prev, final, share) -> tuple[np.ndarray, np.ndarray]:
    """(pages, live KV tokens) held after passes `idx`: the pass's own when it completes, else what
    the previous pass `prev` held (where `has_prev`) plus `share` of the pass's growth, pages rounded up."""
    w, bs = sim.w, sim.config.block_size
    before_alloc = np.where(has_prev, w.alloc_kv_tokens[prev], 0)
    before_live = np.where(has_prev, w.live_kv_tokens[prev], 0)
    blocks = np.where(
        final,
        sim.blocks[idx],
        -(-np.ceil(before_alloc + (w.alloc_kv_tokens[idx] - before_alloc) * share).astype(np.int64) // bs),
    )
    live = np.where(
        final, w.live_kv_tokens[idx], (before_live + (w.live_kv_tokens[idx] - before_live) * share).astype(np.int64)
    )
    return blocks, live
