"""`solm`: the one command line. Thin: parses arguments and dispatches to `solm.commands.<name>`.

Every command prints a human summary and ends with one JSON line of its figures (`--json`: the
JSON line only). A user mistake (bad path, unknown name, corrupt trace, impossible setting) is
one line on stderr, `solm <command>: error: ...`, and exit status 2; never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from solm.commands import COMMANDS


class CommandError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


def user_errors() -> tuple[type[BaseException], ...]:
    from profiler.reader import TraceError

    return (CommandError, TraceError, FileNotFoundError, FileExistsError, NotADirectoryError, KeyError, ValueError,
            MemoryError)


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    parser = argparse.ArgumentParser(prog="solm", description="self-orchestrating language models: capture, inspect, "
                                     "simulate and compare runs")
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
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    parser, modules = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    try:
        return int(modules[args.command].run(args) or 0)
    except user_errors() as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        print(f"solm {args.command}: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"solm {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `solm ... | head`: the reader left; not an error of ours
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
