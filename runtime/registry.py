"""Lazy name -> class registries. Plain string keys mapping to "module:attr" paths, so each system
adds one line and importing the registry imports no engine, task or recipe it does not use.
A name whose module is not present in this build is reported as unknown, never half-loaded.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from profiler.errors import UnknownName


def available(table: dict[str, str]) -> list[str]:
    out = []
    for name, path in table.items():
        mod = path.split(":")[0]
        if importlib.util.find_spec(mod) is not None:
            out.append(name)
    return sorted(out)


def resolve(table: dict[str, str], name: str, what: str) -> Any:
    if name not in table or name not in available(table):
        raise UnknownName(f"unknown {what} {name!r}; valid {what}s: {', '.join(available(table))}")
    mod, attr = table[name].split(":")
    return getattr(importlib.import_module(mod), attr)
