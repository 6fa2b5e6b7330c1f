"""solm profiler: trace format v1 (schema, writer, reader, validator), the step recorder, NVML /
host counter sampling, and trace summaries. Imports none of solm's other packages: the trace
format is the contract between the runtime and the simulator and dashboard.
"""

from profiler.reader import Trace, TraceError, read_trace
from profiler.schema import SCHEMA_VERSION
from profiler.writer import TraceWriter

__all__ = ["SCHEMA_VERSION", "Trace", "TraceError", "TraceWriter", "read_trace"]
