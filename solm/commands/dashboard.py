"""`solm dashboard [DIR...] [--port P]`: the Streamlit dashboard over trace directories.

What: starts `streamlit run dashboard/app.py` (headless, no usage statistics) on 127.0.0.1 by
default (another address prints a warning line); the directories (traces, or folders holding
traces, searched two levels deep) are passed to the app, whose sidebar opens only them and the
folders below (`--allow-any-path`: any). The server dies with this command (SIGTERM, Ctrl-C, even
SIGKILL). Pages: Overview, Pareto, Timeline, Dependence graph, What-if, Diff.
Why: measured and simulated trade-offs side by side in a browser.

    solm dashboard traces/ runs/sim --port 8501     # then open http://127.0.0.1:8501
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from profiler.errors import UsageError
from profiler.outdir import check_given_once, resolved
from profiler.services import check_address_form, check_port_free, die_with_parent, is_loopback, terminate_on_signal

APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "dashboard", help="open the Streamlit dashboard on trace directories", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "dirs",
        nargs="*",
        metavar="DIR",
        default=[],
        help="trace directories or folders of traces (default: the current directory)",
    )
    p.add_argument("--port", type=int, default=8501, help="port (default 8501)")
    p.add_argument(
        "--address",
        default="127.0.0.1",
        help="address to serve on (default 127.0.0.1: this machine "
        "only; any other address serves the traces to whoever can reach it, with a warning)",
    )
    p.add_argument(
        "--allow-any-path",
        action="store_true",
        help="let the sidebar open any folder on this machine (default: only the folders given here, and below)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the streamlit command line and exit")


def command(dirs: list[str], port: int, address: str = "127.0.0.1", allow_any_path: bool = False) -> list[str]:
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP),
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "viewer",
        "--server.address",
        address,
        "--server.port",
        str(port),
        "--",
        *dirs,
        *(["--allow-any-path"] if allow_any_path else []),
    ]


def exposure_warning(address: str, allow_any_path: bool) -> str | None:
    """The warning line for an address beyond loopback (None on loopback)."""
    if is_loopback(address):
        return None
    what = "any folder on this machine (--allow-any-path)" if allow_any_path else "the traces in these folders"
    return (
        f"solm dashboard: warning: serving on {address}, not loopback: whoever can reach this machine on "
        f"that address can read {what}, with no login"
    )


def serve(cmd: list[str], env: dict[str, str]) -> int:
    """Run the server as a child that dies with this process: SIGTERM/SIGHUP/Ctrl-C here stop it
    (forwarded, then waited for), and a SIGKILL here reaches it through PR_SET_PDEATHSIG."""
    with terminate_on_signal():
        child = subprocess.Popen(cmd, env=env, preexec_fn=die_with_parent)
        try:
            return child.wait()
        except BaseException:
            child.terminate()
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            raise


def run(args: argparse.Namespace) -> int:
    if not 0 < args.port < 65536:
        raise UsageError(f"--port {args.port} is not a port (1..65535)")
    check_address_form(args.address)  # was: "" accepted (streamlit then listens on every interface)
    check_given_once(args.dirs, "DIR")  # was: every trace under it listed twice
    dirs = [str(resolved(d)) for d in (args.dirs or ["."])]  # realpath: a symlink loop stays a path, not an error
    for d in dirs:
        if not Path(d).is_dir():
            what = "not a directory" if os.path.lexists(d) else "no such directory"
            raise UsageError(f"{d}: {what} (pass trace directories or folders of traces)")
    try:
        import streamlit  # noqa: F401
    except ModuleNotFoundError:
        raise UsageError("streamlit is not installed in this environment (make venv installs it)") from None
    cmd = command(dirs, args.port, args.address, args.allow_any_path)
    if not args.dry_run:
        check_port_free(args.address, args.port)  # was: "serving ... at" printed, then streamlit's exit 1
    host = f"[{args.address}]" if ":" in args.address else args.address  # was: http://::1:8501, no URL
    url = f"http://{host}:{args.port}"
    warning = exposure_warning(args.address, args.allow_any_path)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    print(
        json.dumps({"url": url, "dirs": dirs, "command": cmd})
        if args.dry_run
        else f"serving {len(dirs)} folder(s) at {url} (Ctrl-C stops)",
        flush=True,
    )
    if args.dry_run:
        return 0
    # the folders also go in the environment, which the app reads first (a stale SOLM_TRACE_DIRS
    # or SOLM_ALLOW_ANY_PATH in the user's shell must not win over what is given here)
    return serve(
        cmd,
        {
            **os.environ,
            "SOLM_TRACE_DIRS": os.pathsep.join(dirs),
            "SOLM_ALLOW_ANY_PATH": "1" if args.allow_any_path else "0",
        },
    )
