"""A user's CSV table read strictly: every row has the header's fields, the header names each column once.

What: `read_csv_table(path, what)` is `pandas.read_csv` of a file `profiler.outdir.input_file` has
already checked, with two refusals pandas does not make (each one UsageError line):
- a row with more fields than the header: pandas took the header as naming the columns *after* an
  index, so `0,10,5,7` under `arrived_at,num_prefill_tokens,num_decode_tokens` was read as a prompt
  of 5 and an answer of 7 (the columns shifted by one), exit 0;
- a column named twice (or twice but for case and spaces, as the GEMM reader matches names):
  pandas renamed the second `m.1` and the reader silently took one of the two.
Why: the workload files (`simulator/cluster/workload_file.py`) and the GEMM tables
(`simulator/gemm_calibration.py`) are the user's own files; a misread one gives figures of another
workload or another fit with nothing said.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd

from profiler.errors import UsageError


def read_csv_table(path: Path, what: str) -> pd.DataFrame:
    """The table (UsageError, one line, if it is not a CSV of one header and rows of its width)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", pd.errors.ParserWarning)  # index_col=False: a wider row warns
            header = pd.read_csv(path, header=None, nrows=1, dtype=str, keep_default_na=False).iloc[0].tolist()
            frame = pd.read_csv(path, index_col=False)
    except pd.errors.ParserWarning:
        raise UsageError(f"{path}: a row has more fields than the header's {len(header)}; not a {what}") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as error:
        raise UsageError(f"{path}: not a {what} ({str(error).splitlines()[0]})") from None
    names = [str(name).strip().lower() for name in header]
    twice = [name for i, name in enumerate(names) if name in names[:i]]
    if twice:
        raise UsageError(f"{path}: the header names column {twice[0]!r} twice; not a {what}")
    return frame
