"""Real workloads: a production request log's arrivals and lengths, with a trace's structure.

What: `read_workload_file` reads a CSV in the layout of the public Azure/Splitwise traces
(`arrived_at,num_prefill_tokens,num_decode_tokens`, one row per request in arrival order; the
copies in `simulator/data/workloads/` with their README and licence), validated: a missing
column, a length outside 1..2^20 tokens, an arrival before the previous one, more requests than a
replay takes (`MAX_REQUESTS`) or arrivals spanning more than `MAX_ARRIVAL_S` is one UsageError line.
`--columns arrived_at=ts,...` reads a file whose columns are named otherwise.

`stretch` gives each request of the file a structure sampled (seeded) from a trace's requests and
stretched to the request's prompt and output lengths, pass by pass:

- the leading prefill passes: query tokens and live KV scale by P / P0 and their KV reads by
  q'(q' + 1) / q(q + 1) (exact for causal attention over the prompt);
- the generation passes are time-warped to round(n x O / O0) passes (new pass j follows source
  pass floor(j n / n')): each keeps its source's streams, query rows, tokens emitted and phase,
  so PASTA's threads split the output as measured and planned diffusion's spans keep their
  share of the denoise steps; the live KV the prefill left (the prompt, less what a budget
  policy evicted during it) scales by P / P0 and the generated part beyond it by O / O0, so
  TIP's evictions keep the measured live fraction (a pass evicts, scaled like its live KV, what
  its source passes evicted since the previous pass's source: a repeated source pass evicts
  once, a skipped one on the next pass); KV reads scale with the live KV they read.

P0 is the source request's prompt; O and O0 count the tokens of the generation passes (the
prefill's first token aside), so a one-token answer is its prefill alone. The result is a `Workload` the replay
serves like any trace's; its output tokens are what the stretched passes emit (O up to one pass
of rounding).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from profiler.errors import UsageError, quoted
from profiler.outdir import input_file
from simulator.replay import MAX_REQUESTS, MIN_RATE
from simulator.workload import MAX_CONTEXT_TOKENS, Workload

COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
# the latest arrival a --rate replay reaches (MAX_REQUESTS at MIN_RATE); later, float64 seconds
# lose the microseconds latencies are made of (arrivals at 1e300 s gave latencies of 0 ms)
MAX_ARRIVAL_S = MAX_REQUESTS / MIN_RATE
PAGE_TOKENS = 16
# a file this large is not a workload (MAX_REQUESTS rows of ~100 bytes are 100 MB): a 20 GiB sparse file
# of zeros read whole ran for minutes
MAX_FILE_BYTES = 1 << 30
WORKLOADS_DIR = Path(__file__).resolve().parents[1] / "data" / "workloads"


@dataclasses.dataclass(frozen=True)
class RequestLog:
    arrival_s: np.ndarray  # (N,) from the first request, divided by the time scale
    prompt_tokens: np.ndarray  # (N,)
    output_tokens: np.ndarray
    path: str


def parse_columns(text: str | None) -> dict[str, str]:
    """`arrived_at=ts,num_prefill_tokens=in,num_decode_tokens=out` -> {expected: file column}."""
    mapping = {c: c for c in COLUMNS}
    if text is None:
        return mapping
    given: set[str] = set()
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in COLUMNS or not value.strip():
            raise UsageError(f"--columns takes EXPECTED=FILE_COLUMN pairs for {', '.join(COLUMNS)}; got {quoted(item)}")
        if key.strip() in given:  # was: the last pair won quietly
            raise UsageError(f"--columns maps {key.strip()} twice; map it once")
        given.add(key.strip())
        mapping[key.strip()] = value.strip()
    if not given:  # was: `--columns ",,"` (or "") read as no mapping
        raise UsageError(f"--columns names no EXPECTED=FILE_COLUMN pair (for {', '.join(COLUMNS)}); got {quoted(text)}")
    columns = list(mapping.values())
    shared = [have for i, have in enumerate(columns) if have in columns[:i]]
    if shared:  # was: arrived_at=num_prefill_tokens read each prompt length as an arrival time, exit 0
        users = [want for want, have in mapping.items() if have == shared[0]]
        raise UsageError(
            f"--columns reads {' and '.join(users)} both from the column {shared[0]!r}; map each to its own"
        )
    return mapping


def read_workload_file(path: str | Path, columns: str | None = None, time_scale: float = 1.0) -> RequestLog:
    """The file's requests (ValueError, one line, for anything malformed)."""
    if not (time_scale > 0 and np.isfinite(time_scale)):
        raise UsageError(f"--time-scale must be a positive number, got {time_scale!r}")
    path = input_file(path, "workload file", MAX_FILE_BYTES)
    mapping = parse_columns(columns)
    values = _columns(path, mapping)
    arrival_s = _arrivals_s(path, values["arrived_at"], time_scale)
    return RequestLog(
        arrival_s,
        values["num_prefill_tokens"].astype(np.int64),
        values["num_decode_tokens"].astype(np.int64),
        str(path),
    )


def _columns(path: Path, mapping: dict[str, str]) -> dict[str, np.ndarray]:
    """The CSV's three columns as floats (under our names), each checked: present, numeric, token
    counts whole numbers in 1..MAX_CONTEXT_TOKENS; 1..MAX_REQUESTS rows."""
    import pandas as pd

    from simulator.csv_input import read_csv_table

    frame = read_csv_table(path, "CSV workload")
    missing = [
        f"{want}" + (f" (as {have!r})" if have != want else "")
        for want, have in mapping.items()
        if have not in frame.columns
    ]
    if missing:
        raise UsageError(
            f"{path}: missing column {', '.join(missing)}; expected {', '.join(COLUMNS)} "
            f"(or map yours with --columns arrived_at=...,num_prefill_tokens=...,num_decode_tokens=...)"
        )
    if not len(frame):
        raise UsageError(f"{path}: no requests")
    if len(frame) > MAX_REQUESTS:
        raise UsageError(
            f"{path}: {len(frame)} requests; the simulator replays at most {MAX_REQUESTS} (split the file)"
        )
    values = {}
    for want, have in mapping.items():
        # read_csv turns True/False into booleans, which to_numeric would take as 1 and 0
        is_bool = frame[have].map(lambda v: isinstance(v, (bool, np.bool_))).to_numpy(bool)
        col = np.where(is_bool, np.nan, pd.to_numeric(frame[have].where(~is_bool), errors="coerce").to_numpy(float))
        bad = np.flatnonzero(~np.isfinite(col))
        if len(bad):
            value = frame[have].iloc[bad[0]]
            value = value.item() if isinstance(value, np.generic) else value  # np.True_ -> True
            raise UsageError(f"{path}: row {bad[0] + 1}: {have} is not a number ({quoted(value)})")
        values[want] = col
    for want in COLUMNS[1:]:
        col = values[want]
        bad = np.flatnonzero((col < 1) | (col > MAX_CONTEXT_TOKENS) | (col != np.round(col)))
        if len(bad):
            raise UsageError(
                f"{path}: row {bad[0] + 1}: {mapping[want]} must be a whole number in 1..{MAX_CONTEXT_TOKENS}, "
                f"got {_number(col[bad[0]])}"
            )
    return values


def _arrivals_s(path: Path, arrival: np.ndarray, time_scale: float) -> np.ndarray:
    """Arrival times from the first, in seconds after --time-scale; in order, >= 0 and spanning at
    most MAX_ARRIVAL_S."""
    back = np.flatnonzero(np.diff(arrival) < 0)
    if len(back):
        raise UsageError(
            f"{path}: row {back[0] + 2}: arrival {arrival[back[0] + 1]:g} before the previous "
            f"{arrival[back[0]]:g}; rows must be in arrival order"
        )
    if arrival[0] < 0:
        raise UsageError(f"{path}: row 1: negative arrival {arrival[0]:g}")
    with np.errstate(over="ignore"):  # an overflow to inf is refused below, not warned about
        arrival_s = (arrival - arrival[0]) / time_scale
    if not arrival_s[-1] <= MAX_ARRIVAL_S:  # also inf: a tiny --time-scale overflows
        raise UsageError(
            f"{path}: the arrivals span {arrival_s[-1]:g} s (after --time-scale {time_scale:g}); at most "
            f"{MAX_ARRIVAL_S:g} s, beyond which the simulated clock loses the microseconds latencies are made of"
        )
    return arrival_s


def _number(value: float) -> str:
    """A length as the file wrote it: whole numbers in full (1048577, not 1.04858e+06, which reads
    as within 1..1048576), others to 10 significant digits."""
    return f"{value:.0f}" if abs(value) < 1e15 and value == round(value) else f"{value:.10g}"  # NaN, inf: "g"


def _source_shape(w: Workload) -> tuple[np.ndarray, np.ndarray]:
    """(usable source requests, leading prefill passes of each request)."""
    from simulator.cluster.passes import leading_prefill_passes

    n_pre = leading_prefill_passes(w)
    ok = (
        (w.n_passes > 0)
        & (n_pre >= 1)
        & (w.n_passes > n_pre)
        & (w.output_tokens >= 1)
        & np.array([s != "error" for s in w.status])
    )
    if not ok.any():
        raise UsageError(
            f"{w.source.get('path', 'structure trace')}: no request with a prefill and generation "
            f"passes to take a structure from"
        )
    return np.flatnonzero(ok), n_pre


def stretch(structure: Workload, log: RequestLog, seed: int = 0) -> Workload:
    """Each logged request with a sampled source structure stretched to its lengths (module doc)."""
    usable, n_pre_all = _source_shape(structure)
    rng = np.random.default_rng(seed)
    src = usable[rng.integers(0, len(usable), len(log.prompt_tokens))]
    w = structure
    P, O = log.prompt_tokens.astype(float), log.output_tokens.astype(float)  # noqa: E741 (P, O: the paper's prompt and output lengths)
    P0 = np.maximum(w.prompt_tokens[src], 1).astype(float)
    n_pre = n_pre_all[src]
    n_gen_old = w.n_passes[src] - n_pre
    G0, G, n_gen = _generation_tokens(w, usable, n_pre_all, src, O, n_gen_old)
    offsets, owner, is_pre, flat = _pass_map(w, src, n_pre, n_gen_old, n_gen)
    p_scale, o_scale = (P / P0)[owner], (G / G0)[owner]
    # the live KV the prefill leaves: the prompt, or less where a budget (window, streaming, h2o)
    # evicted during it; was: the whole prompt, so a window of 8 over a 12-token prompt held 12 a decode
    left0 = np.minimum(P0, w.live_kv_tokens[w.pass_starts[src] + n_pre - 1])
    left = P * left0 / P0  # P exactly where the prefill evicted nothing
    live, q, kv, alloc = _stretched_passes(w, flat, is_pre, p_scale, o_scale, left[owner], left0[owner])
    emits = w.emits[flat].copy()
    per_req = {
        "prompt_tokens": log.prompt_tokens.copy(),
        "arrival_s": log.arrival_s.copy(),
        "output_tokens": np.bincount(owner, weights=emits, minlength=len(src)).astype(np.int64),
        "quality_score": np.full(len(src), np.nan),
    }
    source = {**w.source, "workload_file": log.path, "structure_from": w.source.get("path", "")}
    return Workload(
        request_ids=np.arange(len(src), dtype=np.int64),
        offsets=offsets,
        query_tokens=q,
        kv_tokens_read=kv,
        query_groups=w.query_groups[flat],
        logit_tokens=w.logit_tokens[flat],
        live_kv_tokens=live,
        alloc_kv_tokens=alloc,
        evicted_tokens=_stretched_evictions(w, flat, offsets, is_pre, p_scale, o_scale),
        phase=w.phase[flat],
        emits=emits,
        status=("ok",) * len(src),
        streams=None,
        source=source,
        graphs=w.graphs,  # stream ids: not kept (memory at 100k)
        source_request_ids=w.source_ids()[src],
        **per_req,
    )


def _generation_tokens(
    w: Workload,
    usable: np.ndarray,
    n_pre_all: np.ndarray,
    src: np.ndarray,
    output: np.ndarray,
    n_gen_old: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per new request (`output`: its wanted output tokens, O): G0 and G, the tokens its source's
    generation passes emit and those wanted (the prefill emits the first), and its generation
    passes, round(n x G / G0) (at least one where G > 0)."""
    pre_emits = np.array(
        [w.emits[w.pass_starts[s] : w.pass_starts[s] + k].sum() for s, k in zip(usable, n_pre_all[usable])]
    )
    pre_emits = pre_emits[np.searchsorted(usable, src)]
    G0 = np.maximum(w.output_tokens[src] - pre_emits, 1).astype(float)
    G = np.maximum(output - pre_emits, 0)
    n_gen = np.round(n_gen_old * G / G0).astype(np.int64)
    n_gen[(G > 0) & (n_gen == 0)] = 1
    return G0, G, n_gen


def _pass_map(
    w: Workload, src: np.ndarray, n_pre: np.ndarray, n_gen_old: np.ndarray, n_gen: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The new passes: each request's offsets, each pass's request (owner), whether it is a prefill
    pass, and its source pass in `w` (flat index; generation pass j follows floor(j n / n'))."""
    lengths = n_pre + n_gen
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    owner = np.repeat(np.arange(len(src)), lengths)
    j = np.arange(offsets[-1]) - offsets[:-1][owner]  # pass index within the new request
    is_pre = j < n_pre[owner]
    jg = j - n_pre[owner]
    gen_src = n_pre[owner] + (np.maximum(jg, 0) * n_gen_old[owner]) // np.maximum(n_gen[owner], 1)
    flat = w.pass_starts[src][owner] + np.where(is_pre, j, gen_src)
    return offsets, owner, is_pre, flat


def _stretched_evictions(
    w: Workload,
    flat: np.ndarray,
    offsets: np.ndarray,
    is_pre: np.ndarray,
    p_scale: np.ndarray,
    o_scale: np.ndarray,
) -> np.ndarray:
    """Tokens each new pass evicts: those its source passes since the previous new pass's source
    evicted (a source pass repeated by a longer output counts once, on its first copy, where the
    stretched live KV falls; one skipped by a shorter output counts on the next new pass), scaled
    like the pass's live KV: by P / P0 on prefill passes (was: not scaled, so a doubled prompt's
    prefill took in twice the tokens, held twice the live KV and evicted the source's count), by
    O / O0 on generation passes."""
    evicted = np.cumsum(w.evicted_tokens)[flat]  # through each new pass's source pass
    since = np.diff(evicted, prepend=0)
    first = offsets[:-1][np.diff(offsets) > 0]
    since[first] = w.evicted_tokens[flat[first]]  # a request's first pass: its source pass's own
    return np.round(since * np.where(is_pre, p_scale, o_scale)).astype(np.int64)


def _stretched_passes(
    w: Workload,
    flat: np.ndarray,
    is_pre: np.ndarray,
    p_scale: np.ndarray,
    o_scale: np.ndarray,
    left: np.ndarray,
    left0: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Live KV, query tokens, KV reads and allocated KV of the new passes, scaled from their source
    passes (module doc); `left` and `left0`: the live KV each pass's request's prefill leaves, new
    and source (its prompt where the prefill evicts nothing)."""
    live0 = w.live_kv_tokens[flat].astype(float)
    live = np.where(is_pre, live0 * p_scale, left + np.maximum(live0 - left0, 0) * o_scale)
    live = np.maximum(np.round(live), 1).astype(np.int64)
    q = np.where(is_pre, np.maximum(np.round(w.query_tokens[flat] * p_scale), 1), w.query_tokens[flat]).astype(np.int64)
    q0 = w.query_tokens[flat].astype(float)
    kv_scale = np.where(is_pre, q * (q + 1.0) / np.maximum(q0 * (q0 + 1), 1), live / np.maximum(live0, 1))
    kv = np.maximum(np.round(w.kv_tokens_read[flat] * kv_scale), q).astype(np.int64)
    alloc = np.maximum(-(-live // PAGE_TOKENS) * PAGE_TOKENS, live)
    return live, q, kv, alloc
