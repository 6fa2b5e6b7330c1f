"""The (pass, request) rows of a finished replay, stored compactly, columns built on access.

What: one row per request in each batched forward pass it took part in, sorted by request then
pass (`simulator.simtrace.collect` builds them). A 100k-request cluster replay has 21 million such
rows; fourteen int64/float64 columns of them took 2.4 GB, and the sort and the trace writer
several times that. Here a row is its request (int32), its workload pass (`flat`, int32 below
2**31 passes) and its global pass index (`batch`, int32); a pass's start and duration are kept once per pass; every other
column is the workload's value of that pass, except on the rows whose pass was the request's own
(a prefill chunk, a recompute: `own_at`), which keep their own values. `rows[key]` builds a whole
column as an int64/float64/bool array, as the dict of columns it replaces did; `column(key, lo,
hi)` builds a slice of one (the trace writer streams them).

    rows = result.rows
    rows["query"]                       # (rows,) query tokens of each row
    rows.column("start_s", 0, 1000)     # the first 1,000 rows' pass starts
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

# per-row columns of a pass's own demand where it is not the workload's (a chunk, a recompute)
OWN_COLUMNS = ("query", "kv_read", "groups", "blocks", "live", "emits", "rebuild", "final")
# the workload's array holding each own column's value for a whole workload pass
WORKLOAD_ARRAYS = {
    "query": "query_tokens",
    "kv_read": "kv_tokens_read",
    "groups": "query_groups",
    "live": "live_kv_tokens",
    "emits": "emits",
}
KEYS = ("request", "flat", "start_s", "duration_s", "batch_index", "step_index", *OWN_COLUMNS)


class PassRows(Mapping):
    """Rows sorted by (request, pass); a read-only mapping of column name -> array (module doc)."""

    def __init__(
        self,
        workload,
        blocks: np.ndarray,
        request: np.ndarray,
        flat: np.ndarray,
        batch: np.ndarray,
        pass_start_s: np.ndarray,
        pass_duration_s: np.ndarray,
        own_at: np.ndarray,
        own: dict[str, np.ndarray],
    ) -> None:
        self.w, self.blocks = workload, blocks
        self.request, self.flat, self.batch = request, flat, batch
        self.pass_start_s, self.pass_duration_s = pass_start_s, pass_duration_s
        self.own_at, self.own = own_at, own  # sorted row positions, and their columns in that order
        self.counts = np.bincount(request, minlength=workload.n_requests)  # rows of each request
        self.first_row = np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)

    @property
    def n(self) -> int:
        return len(self.request)

    def __len__(self) -> int:
        return len(KEYS)

    def __iter__(self) -> Iterator[str]:
        return iter(KEYS)

    def __getitem__(self, key: str) -> np.ndarray:
        return self.column(key)

    def column(self, key: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Rows lo..hi of column `key`."""
        hi = self.n if hi is None else hi
        if key == "request":
            return self.request[lo:hi].astype(np.int64)
        if key == "flat":
            return self.flat[lo:hi].astype(np.int64)
        if key == "batch_index":
            return self.batch[lo:hi].astype(np.int64)
        if key == "start_s":
            return self.pass_start_s[self.batch[lo:hi]]
        if key == "duration_s":
            return self.pass_duration_s[self.batch[lo:hi]]
        if key == "step_index":
            return np.arange(lo, hi, dtype=np.int64) - self.first_row[self.request[lo:hi]]
        if key not in OWN_COLUMNS:
            raise KeyError(key)
        flat = self.flat[lo:hi]
        if key in WORKLOAD_ARRAYS:
            out = getattr(self.w, WORKLOAD_ARRAYS[key])[flat]
        elif key == "blocks":
            out = self.blocks[flat]
        else:
            out = np.ones(len(flat), bool) if key == "final" else np.zeros(len(flat), np.int64)
        a, b = np.searchsorted(self.own_at, [lo, hi])
        out[self.own_at[a:b] - lo] = self.own[key][a:b]
        return out

    def pass_totals(self, values: np.ndarray | None = None) -> np.ndarray:
        """Per pass (global index): the sum of `values` (one per row; None: 1) over its rows, as float."""
        return np.bincount(self.batch, weights=values, minlength=len(self.pass_start_s))


def build(sim) -> PassRows:
    """The rows of every stretch of a finished replay (`sim.stretches`), sorted by (request, pass)."""
    own_parts = [s for s in sim.stretches if s.demand is not None]
    plain = [s for s in sim.stretches if s.demand is None]
    n_own = sum(len(s.requests) for s in own_parts)
    n = n_own + sum(len(s.requests) * len(s.durations_s) for s in plain)
    flat_type = np.int32 if len(sim.blocks) < 2**31 else np.int64  # a workload pass
    req, flat, batch = np.zeros(n, np.int32), np.zeros(n, flat_type), np.zeros(n, np.int32)
    at = 0
    for keys in [_own_keys(own_parts)] + list(_plain_keys(plain)):  # the own rows first
        k = len(keys[0])
        req[at : at + k], flat[at : at + k], batch[at : at + k] = keys
        at += k
    order = np.lexsort((batch, req))
    req = req[order]  # one column at a time: one copy alive at once (21 million rows at 100k requests)
    flat = flat[order]
    batch = batch[order]
    own_at = np.flatnonzero(order < n_own)  # sorted positions of the own rows
    src = order[own_at]
    del order
    own: dict[str, np.ndarray] = {
        k: np.asarray(
            np.concatenate([getattr(s.demand, k) for s in own_parts]) if own_parts else [],
            bool if k == "final" else np.int64,
        )[src]
        for k in OWN_COLUMNS
    }
    start, dur = _pass_times(sim)
    return PassRows(sim.w, sim.blocks, req, flat, batch, start, dur, own_at, own)


def _own_keys(stretches: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(request, flat, batch) of one-pass stretches of the requests' own demand."""
    if not stretches:
        return np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0, np.int32)
    n = [len(s.requests) for s in stretches]
    return (
        np.concatenate([s.requests for s in stretches]),
        np.concatenate([s.demand.flat for s in stretches]),
        np.repeat([s.first_batch for s in stretches], n),
    )


def _plain_keys(stretches: list, group: int = 4096):
    """(request, flat, batch) of stretches of whole workload passes, `group` stretches at a time
    (vectorised: no Python loop per row; the temporaries of one group at a time)."""
    for i in range(0, len(stretches), group):
        part = stretches[i : i + group]
        n_req = np.array([len(s.requests) for s in part], np.int64)
        n_pass = np.array([len(s.durations_s) for s in part], np.int64)
        m = np.repeat(n_pass, n_req)  # passes of each (stretch, request)
        j = np.arange(int(m.sum())) - np.repeat(np.cumsum(m) - m, m)  # pass within the stretch
        req = np.repeat(np.concatenate([s.requests for s in part]), m)
        flat = np.repeat(np.concatenate([s.first_pass for s in part]), m) + j
        batch = np.repeat(np.repeat([s.first_batch for s in part], n_req), m) + j
        yield req, flat, batch


def _pass_times(sim) -> tuple[np.ndarray, np.ndarray]:
    """Start and duration of every pass, by global pass index (each stretch's passes are its own)."""
    n = int(sim.n_pass)
    start, dur = np.full(n, np.nan), np.full(n, np.nan)
    if sim.stretches:
        m = np.array([len(s.durations_s) for s in sim.stretches], np.int64)
        at = np.repeat([s.first_batch for s in sim.stretches], m) + (
            np.arange(int(m.sum())) - np.repeat(np.cumsum(m) - m, m)
        )
        if len(at) != n or len(np.unique(at)) != n:
            raise RuntimeError(f"stretches cover {len(np.unique(at))} of {n} passes, {len(at)} times (a bug)")
        start[at] = np.concatenate([s.starts_s for s in sim.stretches])
        dur[at] = np.concatenate([s.durations_s for s in sim.stretches])
    return start, dur
