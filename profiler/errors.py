"""The project's own error types, at the lowest layer so every package may raise them.

The command line (`solm/cli.py`) tells two kinds of failure apart by these types alone:

- `SolmError` and its subclasses are failures the user can act on (a bad flag value, a corrupt
  trace, a configuration that cannot run): one line `solm <command>: error: ...`, exit 2.
- Anything else is a bug in solm: one line saying so (the traceback with SOLM_DEBUG=1), exit 1.

So a module raises `UsageError` for bad input it was handed, `TraceError` for a directory that is
not a readable, valid trace, and lets everything else (an engine's broken invariant, a real
out-of-memory) propagate as what it is. `UsageError` subclasses `ValueError` so that callers and
tests that already catch `ValueError` keep working.
"""

from __future__ import annotations

import json
import numbers
import os
import sys
from collections.abc import Callable


class SolmError(Exception):
    """A failure the user can act on: printed as one line, exit status 2."""


class UsageError(SolmError, ValueError):
    """Bad input: a flag value out of range, an unknown name, a path that cannot be used."""


class TraceError(SolmError):
    """A directory that cannot be read as a (valid) trace of this version."""


class KVPoolFull(SolmError):
    """The KV pool has no free page: a scheduling signal (preempt, wait), not an out-of-memory.

    Engines catch it to preempt; one that escapes means a configured pool too small for the work.
    """


class UnknownName(UsageError, KeyError):
    """A name looked up in a catalog or registry that is not there (a hardware part, a model, a
    scheduler). Also a `KeyError`, so lookups keep their usual contract; prints as its message
    (a plain `KeyError` prints its argument quoted)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class TraceMetaError(TraceError, ValueError):
    """A trace's meta.json entry of the wrong type or shape (e.g. its `model`): a TraceError for
    the command line, and a ValueError for callers that validate meta dicts."""


def is_utf8(text: str) -> bool:
    """False for a str holding os.fsdecode's surrogates (a file name of bytes that are not UTF-8)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def is_count(value: object, low: int = 1) -> bool:
    """True for a whole number (a Python or numpy integer) of at least `low`; False for a bool (an
    int subclass: `True` is no count of threads, GPUs or replicas), a float, a string or anything
    else."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= low


def one_line(text: str) -> str:
    """`text` with control characters escaped (a path holding a newline named in an error stays one
    line) and bytes that are not UTF-8 shown as \\xNN (os.fsdecode's surrogates cannot be printed)."""
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


_RAISE = object()


def parse_json(
    text: str | bytes,
    what: str,
    error: type[SolmError] = UsageError,
    *,
    default: object = _RAISE,
    parse_constant: Callable[[str], object] | None = None,
) -> object:
    """`json.loads(text)`, its every failure one `error` (UsageError for a flag's or a named input
    file's text, TraceError for a trace's) naming `what`: malformed text or bytes that are not
    UTF-8, nesting deeper than Python's recursion allows, and an integer of more digits than
    Python converts (4300; json's ValueError, not a JSONDecodeError). `default`, if given, is
    returned for text that is not JSON at all (a `--knob` value that is a plain word); the other
    failures still raise. A SolmError from `parse_constant` (refusing NaN) passes through."""
    try:
        return json.loads(text, parse_constant=parse_constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        if default is not _RAISE:
            return default
        raise error(f"{what}: not valid JSON ({one_line(str(e))})") from None
    except RecursionError:
        raise error(f"{what}: not valid JSON (nested too deeply)") from None
    except SolmError:
        raise
    except ValueError:  # "Exceeds the limit (4300 digits) for integer string conversion"
        raise error(f"{what}: not valid JSON (an integer of more than {sys.get_int_max_str_digits()} digits)") from None


def cut(text: str, most: int = 60) -> str:
    """`text` for an error line, cut after `most` characters (a CSV cell of 5,000 digits, or a
    binary file's header read as a column name, would otherwise be the whole line)."""
    return text if len(text) <= most else f"{text[:most]}... ({len(text)} characters)"


def shorten_words(line: str, longest_line: int = 400, longest_word: int = 60, most: int = 1000) -> str:
    """An error line kept readable however long the value it names: past `longest_line`
    characters, each word (a run without spaces) over `longest_word` keeps its head and tail with
    its length between (a 5,000-character flag value, a path of 3,000), so the words around it (a
    list of valid names) survive; a line still over `most` is cut there. A shorter line is as given."""
    if len(line) <= longest_line:
        return line
    half = longest_word // 2
    words = [
        w if len(w) <= longest_word else f"{w[:half]}...{w[-half:]} ({len(w)} characters)" for w in line.split(" ")
    ]
    return cut(" ".join(words), most)


def error_line(e: BaseException) -> str:
    """An error as the one line a command prints after `solm <command>: error: `: an OSError as
    "path: reason", anything else as its text (its type's name when it has none); control
    characters escaped and a runaway word shortened (`one_line`, `shorten_words`)."""
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        return shorten_words(one_line(f"{os.fsdecode(e.filename)}: {e.strerror}"))
    return shorten_words(one_line(str(e) or type(e).__name__))


def quoted(value: object, most: int = 60) -> str:
    """`repr(value)` for an error line, cut after `most` characters."""
    return cut(repr(value), most)
