"""Counter sampling in a background thread: NVML on an NVIDIA GPU, host counters elsewhere.

NVML (`nvidia-ml-py`, module `pynvml`): memory used, utilisation, power, cumulative energy
(`nvmlDeviceGetTotalEnergyConsumption`, mJ, Volta and newer; integrated from power where the
call is unsupported), SM clock and temperature. Where NVML cannot start (`pynvml.NVMLError`,
or the module is missing) the sampler records host counters (process CPU %, RSS) and keeps the
reason, which the capture writes into meta.json.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

NAN = float("nan")


def _row(t_s: float, source: str, **values: float) -> dict:
    row = {
        "t_s": t_s,
        "source": source,
        "gpu_memory_used_bytes": NAN,
        "gpu_utilization_percent": NAN,
        "power_w": NAN,
        "energy_mj": NAN,
        "sm_clock_mhz": NAN,
        "temperature_c": NAN,
        "cpu_percent": NAN,
        "rss_bytes": NAN,
    }
    row.update(values)
    return row


class CounterSampler:
    def __init__(
        self, interval_s: float = 0.05, device_index: int = 0, origin: float | None = None, use_nvml: bool = True
    ) -> None:
        if not 0 < interval_s < math.inf:  # also refuses NaN
            raise ValueError(f"sampling interval must be a finite number > 0 s, got {interval_s}")
        self.interval_s = interval_s
        self.device_index = device_index
        self.origin = time.perf_counter() if origin is None else origin
        self.rows: list[dict] = []
        self.source = "host"
        self.reason = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._nvml: Any = None
        self._handle: Any = None
        self._energy0: float | None = None
        self._energy_supported = True
        self._proc: Any = None
        self._try_nvml()
        if not use_nvml and self._nvml is not None:  # a CPU capture on a GPU machine: host counters
            self._nvml.nvmlShutdown()
            self._nvml, self.source, self.reason = None, "host", "CPU capture (NVML present but not used)"
        elif not use_nvml:
            self.reason = f"CPU capture; {self.reason}"
        if self.source == "host":
            import psutil

            self._proc = psutil.Process()
            self._proc.cpu_percent(None)  # prime: the first call always returns 0

    def _try_nvml(self) -> None:
        try:
            import pynvml
        except ImportError as e:
            self.reason = f"pynvml not importable ({e})"
            return
        try:
            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.device_index)
        except pynvml.NVMLError as e:
            self.reason = f"NVML unavailable: {e}"
            return
        self._nvml = pynvml
        self.source = "nvml"
        self.reason = ""

    def sample_once(self) -> dict:
        t = time.perf_counter() - self.origin
        if self.source == "host":
            mem = self._proc.memory_info().rss
            return _row(t, "host", cpu_percent=float(self._proc.cpu_percent(None)), rss_bytes=float(mem))
        nv, h = self._nvml, self._handle
        vals: dict[str, float] = {}
        try:
            vals["gpu_memory_used_bytes"] = float(nv.nvmlDeviceGetMemoryInfo(h).used)
            vals["gpu_utilization_percent"] = float(nv.nvmlDeviceGetUtilizationRates(h).gpu)
            vals["power_w"] = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
            vals["sm_clock_mhz"] = float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
            vals["temperature_c"] = float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
        except nv.NVMLError:
            pass
        if self._energy_supported:
            try:
                e = float(nv.nvmlDeviceGetTotalEnergyConsumption(h))
                if self._energy0 is None:
                    self._energy0 = e
                vals["energy_mj"] = e - self._energy0
            except nv.NVMLError:
                self._energy_supported = False
        if not self._energy_supported and "power_w" in vals:  # integrate power (W * s = J; mJ)
            # from the last row with an energy value: a failed power reading (a NaN row) was a
            # restart at 0, the cumulative energy falling back (was: `self.rows[-1]`, 0 after NaN)
            prev = next((r for r in reversed(self.rows) if r["energy_mj"] == r["energy_mj"]), None)
            e_prev = prev["energy_mj"] if prev else 0.0
            dt = t - prev["t_s"] if prev else 0.0
            vals["energy_mj"] = e_prev + vals["power_w"] * dt * 1000.0
        return _row(t, "nvml", **vals)

    def _loop(self) -> None:
        while not self._stop.is_set():
            row = self.sample_once()
            with self._lock:
                self.rows.append(row)
            # a wait beyond TIMEOUT_MAX (292 years; --counters-hz 1e-300) is an OverflowError that
            # killed this thread (was: a thread traceback on stderr, the capture exit 0)
            self._stop.wait(min(self.interval_s, threading.TIMEOUT_MAX))

    def start(self) -> CounterSampler:
        self._thread = threading.Thread(target=self._loop, name="solm-counters", daemon=True)
        self._thread.start()
        return self

    def snapshot(self) -> list[dict]:
        with self._lock:
            return list(self.rows)

    def stop(self) -> list[dict]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            self.rows.append(self.sample_once())
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass
        return self.snapshot()

    def meta(self) -> dict:
        return {
            "counters_source": self.source,
            "nvml": self.source == "nvml",
            "nvml_reason": self.reason,
            "counters_interval_s": self.interval_s,
        }
