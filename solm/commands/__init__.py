"""One module per `solm` subcommand, each with `add_parser(subparsers)` and `run(args) -> int`."""

COMMANDS = (
    "capture",
    "inspect",
    "train",
    "cost",
    "calibrate",
    "diff",
    "export",
    "dashboard",
    "simulate",
    "validate",
    "sweep",
)


def check_limits(args, limits: dict[str, tuple[str, int, int]]) -> None:
    """Each integer flag of `limits` ({flag: (attribute, lowest, highest)}) in range, else one
    UsageError line; a None value is a default chosen later and passes."""
    from profiler.errors import UsageError

    for flag, (attr, lo, hi) in limits.items():
        value = getattr(args, attr)
        if value is not None and not lo <= value <= hi:
            raise UsageError(f"{flag} must be in {lo}..{hi}, got {value}")
