"""First come, first served (vLLM's default): admit in arrival order (preempted requests first,
at the queue's front), preempt the latest admitted request."""

from scheduling.base import Scheduler


class FCFS(Scheduler):
    name = "fcfs"
