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


# a knob's annotated type (as written in the engine's signature) and the JSON values it takes
KNOB_TYPES: dict[str, tuple[type, ...]] = {
    "bool": (bool,),
    "int": (int,),
    "float": (int, float),
    "str": (str,),
    "None": (type(None),),
}


def check_knob_types(system: str, knobs: dict) -> None:
    """UsageError for a knob whose value is not of the type the engine's signature annotates: a
    string given to a bool knob (`--knob block_sparse=nan`, "nan" not being JSON) was truthy and
    ran as true, exit 0. Knobs the engine does not take are left to its own error."""
    from profiler.errors import UsageError
    from runtime.engines import get_engine

    params = inspect.signature(get_engine(system).__init__).parameters
    for key, value in knobs.items():
        p = params.get(key)
        if p is None or p.annotation is p.empty:
            continue
        ann = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", "")
        names = [n.strip() for n in ann.split("|")]
        if not all(n in KNOB_TYPES for n in names):
            continue
        if not any(
            isinstance(value, t) and (t is bool or not isinstance(value, bool)) for n in names for t in KNOB_TYPES[n]
        ):
            raise UsageError(f"--knob {key}={json.dumps(value)}: {system}'s {key} takes {' or '.join(names)}")


def write_operating_point(system: str, entry: dict) -> None:
    """Record `entry` for `system` (the other systems' entries kept), atomically."""
    from profiler.writer import write_json

    write_json(OPERATING_POINTS_FILE, {**operating_points(), system: entry})
