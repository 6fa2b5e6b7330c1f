"""Processes and services: children die with their parent; servers stay on loopback.

What: `die_with_parent()` asks Linux to send the calling process SIGTERM when its parent exits
(prctl PR_SET_PDEATHSIG), so a pool worker or a server child never outlives a parent that was
killed, even by SIGKILL; `terminate_on_signal()` turns SIGTERM/SIGHUP in the parent into
`SystemExit(128 + signal)`, so the parent's `finally` blocks run (shut the pool down, stop the
child, write what was finished) instead of the process vanishing and leaving its children behind.

    with terminate_on_signal():        # in the parent (a command's run())
        subprocess.Popen(cmd, preexec_fn=die_with_parent)   # or as a pool initializer

`is_loopback(host)` tells a loopback address (127.0.0.0/8, ::1, IPv4-mapped loopback) from one
other machines may reach: commands that listen warn about the latter. `listen_address(address)`
and `check_port_free(address, port)` refuse, before a server starts, an address this machine
cannot serve on (an empty one would listen on every interface) and a port already taken.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import ipaddress
import os
import re
import signal
import socket
import sys
from collections.abc import Iterator

from profiler.errors import UsageError

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """In a child: get `sig` when the parent exits; exit now if it already has. False off Linux.

    Call it first thing in the child (a pool initializer, a Popen preexec_fn). The signal comes
    when the parent *thread* that forked the child ends, so fork from the main thread. The
    child's handler for `sig` is reset to the default (a forked child inherits the parent's
    Python handlers), so the signal ends it even while it is blocked reading a pipe.
    """
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    signal.signal(sig, signal.SIG_DFL)
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(128 + int(sig))
    return True


_RECEIVED: list[int] = []  # signals `terminate_on_signal` turned into an exit, in order


def _raise_exit(signum: int, frame) -> None:
    _RECEIVED.append(signum)
    raise SystemExit(128 + signum)


def received_signal() -> int | None:
    """The first SIGTERM/SIGHUP a `terminate_on_signal` block received in this process, if any: a
    library that catches the SystemExit and raises its own error (Ray inside `ray.wait`) still
    ends the command as stopped by that signal, not as a bug."""
    return _RECEIVED[0] if _RECEIVED else None


@contextlib.contextmanager
def terminate_on_signal(signals: tuple[int, ...] = SIGNALS) -> Iterator[None]:
    """Within the block, SIGTERM/SIGHUP raise SystemExit(128 + sig) (main thread only; a no-op elsewhere)."""
    try:
        previous = {s: signal.signal(s, _raise_exit) for s in signals}
    except ValueError:  # not the main thread: signals cannot be handled here
        yield
        return
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and IPv4-mapped loopback (`::ffff:127.0.0.1`)."""
    try:
        ip = ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        return host == "localhost"
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


_HOST_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def check_address_form(address: str, flag: str = "--address") -> None:
    """A UsageError for an address that is neither an IP literal nor a host name by its form
    (labels of letters, digits and '-', at most 253 characters): 'bogus host', 'HOST:PORT',
    '300.1.1.1'. Nothing is looked up (a test sends no query beyond this machine)."""
    if not address.strip():
        raise UsageError(f"{flag} is empty; give the address to serve on (127.0.0.1: this machine only)")
    try:
        ipaddress.ip_address(address)
        return
    except ValueError:
        pass
    labels = address.rstrip(".").split(".")
    numeric = all(label.isdigit() for label in labels)  # 300.1.1.1: no IP, and no name either
    if numeric or len(address) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels):
        raise UsageError(f"{flag} {address}: not an IP address or a host name")


def listen_address(address: str, flag: str = "--address") -> tuple:
    """The socket address to serve `address` on (its first getaddrinfo entry: family, type, proto,
    sockaddr); a UsageError for an address of no valid form (`check_address_form`) or a name this
    machine cannot resolve."""
    check_address_form(address, flag)
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError, ValueError):
        raise UsageError(f"{flag} {address}: not an IP address or a host name this machine resolves") from None
    return family, kind, proto, sockaddr


def check_port_free(address: str, port: int, flag: str = "--port") -> None:
    """`port` on `address` can be listened on now (bound once and released, with SO_REUSEADDR as a
    server sets it); else a UsageError naming why (in use, not an address of this machine)."""
    family, kind, proto, sockaddr = listen_address(address)
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((sockaddr[0], port, *sockaddr[2:]))
        except OSError as e:
            raise UsageError(
                f"{flag} {port}: cannot serve on {address}:{port} ({e.strerror}); choose another"
            ) from None
