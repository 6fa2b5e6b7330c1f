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


def check_listed_once(values: list, flag: str, text: str) -> None:
    """A value listed twice in a comma-separated flag is one UsageError line (was: sweep ran the
    same configurations twice, their rows doubled; cost printed a column twice)."""
    from profiler.errors import UsageError, cut, quoted

    twice = [v for i, v in enumerate(values) if v in values[:i]]
    if twice:  # each cut: a value of 4,000 digits named twice was the whole error line, twice
        raise UsageError(f"{flag} names {cut(str(twice[0]))} twice, got {quoted(text)}")
