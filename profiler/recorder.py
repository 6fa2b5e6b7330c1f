"""Recorder: wraps an engine's step stream and times each step.

An engine is a generator of step records with a return value (its completion). The recorder
pulls one step at a time and times the pull: that interval is the forward pass plus the engine's
bookkeeping for it, which is what a user of the engine waits for. On a GPU the timer uses CUDA
events and synchronises before reading them; on a CPU, `time.perf_counter`.

Step objects only need `as_row() -> dict` and an `emitted` sequence; the profiler imports
nothing from the runtime.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any


class PerfCounterTimer:
    name = "perf_counter"

    def now(self) -> float:
        return time.perf_counter()

    def interval(self, fn: Callable[[], Any]) -> tuple[Any, float, float]:
        """Run fn; return (its value, start, duration) in seconds on this timer's clock."""
        t0 = time.perf_counter()
        value = fn()
        return value, t0, time.perf_counter() - t0


class CudaEventTimer:
    """CUDA events around each step, synchronised before reading (wall clock for start times)."""

    name = "cuda_event"

    def __init__(self) -> None:
        import torch

        self.torch = torch

    def now(self) -> float:
        return time.perf_counter()

    def interval(self, fn: Callable[[], Any]) -> tuple[Any, float, float]:
        cuda = self.torch.cuda
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        cuda.synchronize()
        t0 = time.perf_counter()
        start.record()
        value = fn()
        end.record()
        end.synchronize()
        return value, t0, start.elapsed_time(end) / 1000.0


def make_timer(device: str) -> PerfCounterTimer | CudaEventTimer:
    return CudaEventTimer() if device.startswith("cuda") else PerfCounterTimer()


_DONE = object()


@dataclass
class RecordedRun:
    result: Any  # the engine's return value (its completion)
    step_rows: list[dict] = field(default_factory=list)
    start_s: float = 0.0  # relative to the recorder's origin
    first_token_s: float = float("nan")
    end_s: float = 0.0


class Recorder:
    def __init__(
        self,
        timer: PerfCounterTimer | CudaEventTimer | None = None,
        memory_fn: Callable[[], int] | None = None,
        origin: float | None = None,
    ) -> None:
        self.timer = timer or PerfCounterTimer()
        self.memory_fn = memory_fn
        self.origin = self.timer.now() if origin is None else origin
        self.batch_index = 0

    def now_s(self) -> float:
        return self.timer.now() - self.origin

    def run(self, steps: Generator[Any, None, Any]) -> RecordedRun:
        rec = RecordedRun(result=None, start_s=self.now_s())

        def pull() -> Any:
            try:
                return next(steps)
            except StopIteration as stop:
                rec.result = stop.value
                return _DONE

        while True:
            step, t0, dur = self.timer.interval(pull)
            if step is _DONE:
                break
            start = t0 - self.origin
            row = step.as_row()
            row.update(
                start_s=start,
                duration_s=dur,
                batch_index=self.batch_index,
                device_memory_bytes=int(self.memory_fn()) if self.memory_fn else -1,
            )
            self.batch_index += 1
            rec.step_rows.append(row)
            if row.get("emitted_tokens", 0) and rec.first_token_s != rec.first_token_s:  # NaN check
                rec.first_token_s = start + dur
        rec.end_s = rec.step_rows[-1]["start_s"] + rec.step_rows[-1]["duration_s"] if rec.step_rows else rec.start_s
        return rec
