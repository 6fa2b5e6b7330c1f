"""solm dashboard entry point: `solm dashboard DIR... [--port P]`, or directly
`streamlit run dashboard/app.py -- DIR...` (the trace folders may also come from the environment
variable SOLM_TRACE_DIRS, separated by the OS path separator).

What: a multipage Streamlit app (Overview, Pareto, Timeline, Dependence graph, What-if, Load, Diff)
over the traces found in the given folders; the folders can be edited in the sidebar, within the
folders given on the command line (any folder with `--allow-any-path`).
Why thin: every page only lays out widgets; frames come from `dashboard.data` (and
`dashboard.whatif_data`, `dashboard.load_data`), figures from
`dashboard.figures` (style item 14).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `streamlit run` puts only dashboard/ on the path
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

from dashboard.views import _shared  # noqa: E402

PAGES = [
    ("views/overview.py", "Overview", "overview", ":material/table:"),
    ("views/pareto.py", "Pareto", "pareto", ":material/scatter_plot:"),
    ("views/timeline.py", "Timeline", "timeline", ":material/view_timeline:"),
    ("views/graph.py", "Dependence graph", "graph", ":material/account_tree:"),
    ("views/whatif.py", "What-if", "whatif", ":material/tune:"),
    ("views/load.py", "Load", "load", ":material/speed:"),
    ("views/diff.py", "Diff", "diff", ":material/compare_arrows:"),
]


def initial_roots() -> list[str]:
    env = os.environ.get("SOLM_TRACE_DIRS")
    if env:
        return [p for p in env.split(os.pathsep) if p]
    args = [a for a in sys.argv[1:] if Path(a).is_dir()]
    return args or [os.getcwd()]


def any_path() -> bool:
    """`solm dashboard --allow-any-path` (or `-- --allow-any-path` after `streamlit run app.py`)."""
    return os.environ.get("SOLM_ALLOW_ANY_PATH") == "1" or "--allow-any-path" in sys.argv[1:]


# a local analysis tool: no Deploy button, rerun or clear-cache in the toolbar (viewer options only)
st.set_option("client.toolbarMode", "viewer")
st.set_page_config(page_title="solm dashboard", layout="wide")
if "roots" not in st.session_state:
    st.session_state["roots"] = "\n".join(initial_roots())
    st.session_state["allowed_roots"] = None if any_path() else initial_roots()
with st.sidebar:
    allowed = _shared.allowed_roots()
    st.text_area(
        "Trace folders (one per line)",
        key="roots",
        height=90,
        help="trace directories, or folders holding traces (searched two levels deep)"
        + ("" if allowed is None else "; only the folders the dashboard was started on, and below"),
    )
    for r, why in _shared.unusable_roots():
        st.warning(f"{r[:80]!r}: {why}")
    for r in _shared.refused_roots():
        st.warning(f"{r}: outside the folders given on the command line (start with --allow-any-path to allow)")
    traces, errors = _shared.load()
    st.caption(f"{len(traces)} trace(s) loaded" + (f", {len(errors)} unreadable" if len(errors) else ""))
nav = st.navigation([st.Page(p, title=t, icon=i, default=(u == "overview")) for p, t, u, i in PAGES])
nav.run()
