"""Continuous-batching scheduling shared by the simulator and the runtime.

What: one policy code (`Scheduler` and its plug-ins, one short file each) that forms every
forward pass's batch; the SimPy replay and the batched server both drive it through the small
`ServingState` protocol (scheduling/protocol.py). This package sits below both: it imports
neither `runtime` nor `simulator` nor torch.

    from scheduling import get_scheduler
    sched = get_scheduler("fcfs")(max_seqs=256, max_batch_tokens=8192)
    batch = sched.schedule(state)   # state: anything implementing ServingState
"""

from profiler.errors import UnknownName, quoted
from scheduling.base import Scheduler
from scheduling.fcfs import FCFS
from scheduling.protocol import ServingState
from scheduling.sjf import SJF

SCHEDULERS: dict[str, type[Scheduler]] = {"fcfs": FCFS, "sjf": SJF}


def get_scheduler(name: str) -> type[Scheduler]:
    """Exact lookup; `UnknownName` (a KeyError) naming the valid policies."""
    try:
        return SCHEDULERS[name]
    except KeyError:
        raise UnknownName(f"unknown scheduler {quoted(name)}; valid names: {', '.join(sorted(SCHEDULERS))}") from None


__all__ = ["FCFS", "SCHEDULERS", "SJF", "Scheduler", "ServingState", "get_scheduler"]
