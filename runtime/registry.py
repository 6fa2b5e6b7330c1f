"""Lazy name -> class registries. Plain string keys mapping to "module:attr" paths, so each system
adds one line and importing the registry imports no engine, task or recipe it does not use.
A name whose module is not present in this build is reported as unknown, never half-loaded.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
from typing import Any

from profiler.errors import UnknownName


def _present(module: str) -> bool:
    """Whether `module` is in this build, found on disk without running any package's __init__
    (find_spec("a.b.c") imports a.b: for the engines' names that imported the engines, and torch, at
    every CLI start)."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)
    for part in rest:
        if spec is None or spec.submodule_search_locations is None:
            return False
        spec = importlib.machinery.PathFinder.find_spec(part, list(spec.submodule_search_locations))
    return spec is not None


def available(table: dict[str, str]) -> list[str]:
    return sorted(name for name, path in table.items() if _present(path.split(":")[0]))


def resolve(table: dict[str, str], name: str, what: str) -> Any:
    if name not in table or name not in available(table):
        raise UnknownName(f"unknown {what} {name!r}; valid {what}s: {', '.join(available(table))}")
    mod, attr = table[name].split(":")
    return getattr(importlib.import_module(mod), attr)
