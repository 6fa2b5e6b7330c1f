"""solm dashboard: Streamlit pages over traces, measured and simulated alike.

`data` (pure pandas) builds frames, `figures` (plotly) draws them, `pages/` only lays out widgets;
`app.py` is the entry point (`solm dashboard DIR...`). Nothing heavy is imported here.
"""
