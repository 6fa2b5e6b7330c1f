"""`solm`: the one command line. Thin: parses arguments and dispatches to `solm.commands.<name>`.

Every command prints a human summary and ends with one JSON line of its figures (`--json`: the
JSON line only). Two kinds of failure, told apart by type (`profiler/errors.py`):

- bad input (a bad flag value, a missing or corrupt trace, an unusable path, an impossible
  setting): the project's own `SolmError`s (`UsageError`, `TraceError`, ...), and a
  missing/unwritable/wrong-kind path the user gave: one line `solm <command>: error: ...`, exit 2;
- anything else is a bug in solm: one line `solm <command>: internal error (a bug): ...`, exit 1,
  and the traceback on stderr when the environment has SOLM_DEBUG=1.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
import traceback
from pathlib import Path
from typing import NoReturn

from profiler.errors import SolmError, UsageError, cut, error_line, is_utf8, one_line, shorten_words
from profiler.services import received_signal
from solm.commands import COMMANDS

EXIT_USAGE = 2  # bad input: the user can fix it
EXIT_BUG = 1  # anything else: a bug in solm
MAX_ERROR_CHARS = 300  # argparse's own error lines are cut here (they quote the value given whole)
PATH_ERRORS = (FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError, PermissionError)
# plain OSErrors that name a path the system refuses as given (a name over NAME_MAX, a symlink loop,
# a read-only file system) or has no room for (a full disk or quota, stdout on /dev/full): the
# user's, by the same rule, when the path is one they gave (or none is named)
PATH_ERRNOS = (errno.ENAMETOOLONG, errno.ELOOP, errno.EROFS, errno.ENOSPC, errno.EDQUOT)


class OneLineParser(argparse.ArgumentParser):
    """argparse's own errors (an unknown flag, a value of the wrong type, a missing argument) as
    one line `solm <command>: error: ...` and exit 2, like every other bad input, instead of the
    command's whole usage block first (`--help` still prints it)."""

    commands: dict[str, argparse.ArgumentParser]  # the top-level parser's: each command's own, by name

    def error(self, message: str) -> NoReturn:
        # a value of 5,000 digits is echoed in `invalid int value: '...'`
        line = cut(one_line(message), MAX_ERROR_CHARS)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {line} (see {self.prog} --help)\n")

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> object:
        """`--n=--` is the value '--', as the user wrote it: Python 3.11's argparse drops a '--'
        even when it is an option's attached value and hands the command an empty list for it
        (was: `solm capture --n=--` exit 1, "'<=' not supported between 'int' and 'list'")."""
        if action.option_strings and action.nargs is None and arg_strings == ["--"]:
            value = self._get_value(action, "--")  # an int flag: "invalid int value: '--'"
            self._check_value(action, value)
            return value
        return super()._get_values(action, arg_strings)


class _Version(argparse.Action):
    """`solm --version`: the version and the checkout's commit (looked up only when asked)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="print solm's version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> NoReturn:
        from profiler.provenance import version_line

        print(version_line())
        parser.exit(0)


def build_parser() -> tuple[OneLineParser, dict]:
    parser = OneLineParser(
        prog="solm", description="self-orchestrating language models: capture, inspect, simulate and compare runs"
    )
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = {}
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"solm.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("solm.commands"):
                continue  # a command not in this build
            raise
        mod.add_parser(sub)
        modules[name] = mod
    parser.commands = dict(sub.choices)
    return parser, modules


def _user_paths(args: argparse.Namespace) -> list[Path]:
    """Every string argument of the command, as an absolute path (the paths the user gave)."""
    out = []
    for value in vars(args).values():
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, str) and v:
                out.append(Path(os.path.abspath(v)))
    return out


def is_user_path_error(e: BaseException, args: argparse.Namespace) -> bool:
    """A path error is the user's when solm raised it itself with a message (no filename: our own
    checks, which name the path), or when the failing file is a path the user gave, lies inside
    one (a file written under --out), or is a missing folder above one (creating --out's parents)."""
    if not isinstance(e, PATH_ERRORS) and not (isinstance(e, OSError) and e.errno in PATH_ERRNOS):
        return False
    if e.filename is None:
        return True
    failed = Path(os.path.abspath(os.fsdecode(e.filename)))
    return any(
        failed == p or p in failed.parents or (failed in p.parents and not failed.exists()) for p in _user_paths(args)
    )


def _check_utf8(args: argparse.Namespace) -> None:
    """An argument that is not UTF-8 (a file name of other bytes) is refused up front: pyarrow, the
    JSON line and the summaries all take paths as UTF-8 text and failed on it with a traceback."""
    for value in vars(args).values():
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, str) and not is_utf8(v):
                raise UsageError(f"{one_line(v)} is not UTF-8 text; rename it (solm reads paths as UTF-8)")


def _cwd_gone(argv: list[str]) -> str | None:
    """The error line when the working directory was deleted (torch's MKL then exits at import with
    'Cannot load libtorch_cpu.so', and every relative path is meaningless); None when it is there."""
    try:
        os.getcwd()
    except FileNotFoundError:
        name = next((a for a in argv if a in COMMANDS), None)
        prog = f"solm {name}" if name else "solm"
        return f"{prog}: error: the working directory no longer exists (deleted); cd to an existing folder"
    return None


OUTPUT_FLAGS = ("out", "perfetto", "html")  # the flags that name what a command writes


def _check_nothing_empty(args: argparse.Namespace, command: argparse.ArgumentParser) -> None:
    """An argument given an empty string (`--out "$DIR"` with DIR unset) is refused, unless that is
    the flag's default: simulate and sweep took an empty --out for none and wrote nothing, calibrate
    called it the working directory; simulate --model '' replayed the trace's own model and cost and
    simulate --gemm-calibration '' used no calibration, each exit 0 as if the flag were not given."""
    for action in command._actions:
        value = getattr(args, action.dest, None)
        values = value if isinstance(value, list) else [value]
        if value == action.default or not any(isinstance(v, str) and not v.strip() for v in values):
            continue
        name = max(action.option_strings, key=len) if action.option_strings else (action.metavar or action.dest)
        what = "the path to write" if action.dest in OUTPUT_FLAGS else "a value"
        what += ", or leave the flag out" if action.option_strings and action.dest not in OUTPUT_FLAGS else ""
        raise UsageError(f"{name} is empty; give {what}")


def main(argv: list[str] | None = None) -> int:
    gone = _cwd_gone(sys.argv[1:] if argv is None else argv)  # before the commands' imports load torch
    if gone:
        print(gone, file=sys.stderr)
        return EXIT_USAGE
    parser, modules = build_parser()
    args, extra = parser.parse_known_args(argv)  # argparse's own errors: one line, exit 2
    if extra:  # said by the command's own parser, so the line names the command (`solm sweep: error: ...`)
        parser.commands.get(args.command, parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if not args.command:
        parser.print_help()
        return EXIT_USAGE
    try:
        _check_utf8(args)
        _check_nothing_empty(args, parser.commands[args.command])
        return int(modules[args.command].run(args) or 0)
    except KeyboardInterrupt:
        print(f"solm {args.command}: interrupted", file=sys.stderr)
        return 130
    except SystemExit:
        sig = received_signal()  # a library's own sys.exit while a signal was stopping the command
        if sig is not None:
            return 128 + sig
        raise
    except BrokenPipeError:  # `solm ... | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:  # noqa: BLE001 - the one place every failure is classified
        sig = received_signal()
        if sig is not None:  # a signal's SystemExit turned into another error on its way out
            print(f"solm {args.command}: stopped by signal {sig}", file=sys.stderr)
            return 128 + sig
        if isinstance(e, SolmError) or is_user_path_error(e, args):
            print(f"solm {args.command}: error: {error_line(e)}", file=sys.stderr)
            return EXIT_USAGE
        if os.environ.get("SOLM_DEBUG") == "1":
            traceback.print_exc()
        first = shorten_words(one_line((str(e).splitlines() or [""])[0]))
        print(
            f"solm {args.command}: internal error (a bug): {type(e).__name__}: {first}; "
            "rerun with SOLM_DEBUG=1 for the traceback",
            file=sys.stderr,
        )
        return EXIT_BUG


if __name__ == "__main__":
    sys.exit(main())
