"""Scheduler policies, one short file each; the replay looks them up here by name."""

from profiler.errors import UnknownName
from simulator.schedulers.base import Scheduler
from simulator.schedulers.fcfs import FCFS
from simulator.schedulers.sjf import SJF

SCHEDULERS: dict[str, type[Scheduler]] = {"fcfs": FCFS, "sjf": SJF}


def get_scheduler(name: str) -> type[Scheduler]:
    """Exact lookup; `KeyError` naming the valid policies."""
    try:
        return SCHEDULERS[name]
    except KeyError:
        raise UnknownName(f"unknown scheduler {name!r}; valid names: {', '.join(sorted(SCHEDULERS))}") from None
