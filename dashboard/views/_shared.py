"""What every page shares: the trace folders, cached loading, trace and request pickers."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import data
from profiler.diff import TraceDiff, diff_traces
from profiler.reader import Trace


# cache_resource, not cache_data: every page shares the read traces as they are; cache_data would
# unpickle a copy of every table on every page run (seconds for a 100k-request simulated trace).
# Pages only read them.
@st.cache_resource(show_spinner="reading traces…", max_entries=16)
def _load(signature: tuple) -> tuple[list[Trace], pd.DataFrame]:
    return data.load_traces([p for p, _ in signature])


@st.cache_data(show_spinner=False, max_entries=64)
def _request_steps(signature: tuple, rid: int, _trace: Trace) -> pd.DataFrame:
    return data.request_steps(_trace, rid)


def request_steps(trace: Trace, rid: int) -> pd.DataFrame:
    """One request's passes (the Timeline's columns), read once per trace and request."""
    return _request_steps(data.signature([trace.path]), rid, trace)


# the diff holds both traces: keyed by the objects too (a reloaded trace is a new one), few kept
@st.cache_resource(show_spinner="diffing…", max_entries=2)
def _diff(signature: tuple, ids: tuple[int, int], _a: Trace, _b: Trace) -> TraceDiff:
    return diff_traces(_a, _b)


def diff(a: Trace, b: Trace) -> TraceDiff:
    """`profiler.diff.diff_traces(a, b)`, computed once per pair of loaded traces (it reads their
    token texts: the page that needs per-token rows)."""
    return _diff(data.signature([a.path, b.path]), (id(a), id(b)), a, b)


@st.cache_data(show_spinner=False, max_entries=16)
def _load_sweeps(signature: tuple) -> tuple[pd.DataFrame, list[str]]:
    errors: list[str] = []
    return data.sweep_points([p for p, _ in signature], errors), errors


def load_sweeps() -> tuple[pd.DataFrame, list[str]]:
    """Configurations of the `solm sweep` tables under the sidebar's folders, as Pareto points, and
    one error line per table that cannot be drawn."""
    allowed = allowed_roots()
    files = [f for f in data.find_sweep_tables(roots()) if allowed is None or data.within(f, allowed)]
    return _load_sweeps(tuple((data.path_key(f), f.stat().st_mtime_ns) for f in files))


def _typed() -> list[str]:
    return [r.strip() for r in st.session_state.get("roots", "").splitlines() if r.strip()]


def typed_roots() -> list[str]:
    """The sidebar's folders that are usable paths (`unusable_roots`: the others, said why)."""
    return [r for r in _typed() if data.path_problem(r) is None]


def unusable_roots() -> list[tuple[str, str]]:
    return [(r, why) for r in _typed() if (why := data.path_problem(r))]


def allowed_roots() -> list[str] | None:
    """The folders the dashboard was started on (None with --allow-any-path: any folder)."""
    return st.session_state.get("allowed_roots")


def roots() -> list[str]:
    """The sidebar's folders that lie inside the folders given on the command line."""
    return data.split_allowed(typed_roots(), allowed_roots())[0]


def refused_roots() -> list[str]:
    return data.split_allowed(typed_roots(), allowed_roots())[1]


def load() -> tuple[list[Trace], pd.DataFrame]:
    """Traces under the sidebar's allowed folders (cached until a trace's meta.json changes); a
    symlink below them that leads outside is not followed."""
    allowed = allowed_roots()
    found = data.find_trace_dirs(roots())
    if allowed is not None:
        found = [p for p in found if data.within(p, allowed)]
    return _load(data.signature(found))


def need_traces(traces: list[Trace]) -> bool:
    if not traces:
        st.info(
            "No readable traces in the folders in the sidebar. Capture one with "
            "`solm capture --system sequential --n 4 --out traces/seq`, then add its folder."
        )
        return False
    return True


def pick_trace(traces: list[Trace], label: str = "Trace", key: str = "trace", index: int = 0) -> Trace:
    labels = data.trace_labels(traces)
    choice = st.selectbox(
        label, range(len(traces)), format_func=lambda i: labels[i], key=key, index=min(index, len(traces) - 1)
    )
    return traces[choice]


def pick_request(trace: Trace, key: str = "request") -> int | None:
    ids = data.request_ids(trace)
    if not ids:
        st.warning(f"{trace.name} has no requests.")
        return None
    prompts = dict(zip(trace.requests["request_id"], trace.requests["prompt"]))
    return st.selectbox("Request", ids, key=key, format_func=lambda r: f"{r}: {str(prompts.get(r, ''))[:60]}")
