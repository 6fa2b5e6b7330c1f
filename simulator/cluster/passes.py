"""Pass-level slicing of a workload: where each request's prompt ends, and sub-ranges of its passes."""

from __future__ import annotations

import dataclasses

import numpy as np

from simulator.workload import PASS_FIELDS, PHASE_CODE, Workload


def leading_prefill_passes(w: Workload) -> np.ndarray:
    """(R,) how many of each request's first passes are prefill passes."""
    is_pre = (w.phase == PHASE_CODE["prefill"]).astype(np.int64)
    out = np.zeros(w.n_requests, np.int64)
    for r in range(w.n_requests):
        lo = w.pass_starts[r]
        hi = lo + w.n_passes[r]
        not_pre = np.flatnonzero(is_pre[lo:hi] == 0)
        out[r] = not_pre[0] if len(not_pre) else hi - lo
    return out


def slice_passes(w: Workload, start: np.ndarray, stop: np.ndarray) -> tuple[Workload, np.ndarray]:
    """Each request's passes [start, stop) as a workload; and the flat-index shift back to `w`."""
    lengths = stop - start
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    shift = w.pass_starts + start - offsets[:-1]
    flat = np.repeat(shift, lengths) + np.arange(offsets[-1])
    fields = {name: getattr(w, name)[flat] for name in PASS_FIELDS}
    streams = None if w.streams is None else w.streams[flat]
    part = dataclasses.replace(w, offsets=offsets, streams=streams, starts=None, **fields)
    return part, shift
