"""What every page shares: the trace folders, cached loading, trace and request pickers."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from dashboard import data
from profiler.reader import Trace


@st.cache_data(show_spinner="reading traces…", max_entries=16)
def _load(signature: tuple) -> tuple[list[Trace], pd.DataFrame]:
    return data.load_traces([p for p, _ in signature])


@st.cache_data(show_spinner=False, max_entries=16)
def _load_sweeps(signature: tuple) -> pd.DataFrame:
    return data.sweep_points([Path(p) for p, _ in signature])


def load_sweeps() -> pd.DataFrame:
    """Configurations of the `solm sweep` tables under the sidebar's folders, as Pareto points."""
    files = data.find_sweep_tables(roots())
    return _load_sweeps(tuple((str(f), f.stat().st_mtime_ns) for f in files))


def roots() -> list[str]:
    return [r.strip() for r in st.session_state.get("roots", "").splitlines() if r.strip()]


def load() -> tuple[list[Trace], pd.DataFrame]:
    """Traces under the sidebar's folders (cached until a trace's meta.json changes)."""
    return _load(data.signature(data.find_trace_dirs(roots())))


def need_traces(traces: list[Trace]) -> bool:
    if not traces:
        st.info("No readable traces in the folders in the sidebar. Capture one with "
                "`solm capture --system sequential --n 4 --out traces/seq`, then add its folder.")
        return False
    return True


def pick_trace(traces: list[Trace], label: str = "Trace", key: str = "trace", index: int = 0) -> Trace:
    labels = data.trace_labels(traces)
    choice = st.selectbox(label, range(len(traces)), format_func=lambda i: labels[i], key=key,
                          index=min(index, len(traces) - 1))
    return traces[choice]


def pick_request(trace: Trace, key: str = "request") -> int | None:
    ids = data.request_ids(trace)
    if not ids:
        st.warning(f"{trace.name} has no requests.")
        return None
    prompts = dict(zip(trace.requests["request_id"], trace.requests["prompt"]))
    return st.selectbox("Request", ids, key=key, format_func=lambda r: f"{r}: {str(prompts.get(r, ''))[:60]}")
