"""Shipped operating points: engine defaults that a benchmark chose on the dev split.

A system whose knobs trade quality for speed ships its recommended setting as its defaults, so
that `solm capture --system S` with no knobs shows the documented behaviour. The setting is
chosen by the system's benchmark on the dev prompts (never the test prompts it reports on) and
recorded, with the command and the dev figures that chose it, in `operating_points.json` beside
this module (`python bench/planned_diffusion.py --write-operating-point`). Engines read their
defaults from it at import; tests check the two agree.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

OPERATING_POINTS_FILE = Path(__file__).with_name("operating_points.json")


def operating_points() -> dict:
    """{system: {"knobs": {...}, "command": ..., "rule": ..., dev figures}} as recorded."""
    if not OPERATING_POINTS_FILE.is_file():
        return {}
    return json.loads(OPERATING_POINTS_FILE.read_text())


def operating_knobs(system: str) -> dict:
    """The knobs recorded for `system` ({} when none is)."""
    return dict((operating_points().get(system) or {}).get("knobs") or {})


def engine_defaults(system: str) -> dict:
    """The keyword defaults of `system`'s engine constructor, as a capture without knobs uses them."""
    from runtime.engines import get_engine

    params = inspect.signature(get_engine(system).__init__).parameters.values()
    return {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY}


def write_operating_point(system: str, entry: dict) -> None:
    """Record `entry` for `system` (the other systems' entries kept), atomically."""
    from profiler.writer import write_json

    write_json(OPERATING_POINTS_FILE, {**operating_points(), system: entry})
