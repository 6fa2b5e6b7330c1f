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


def check_not_empty(args, names: dict[str, str]) -> None:
    """Each argument of `names` ({how the user names it: attribute}) given as an empty string (a
    list: any item) is one UsageError line: `--init "$CKPT"` with CKPT unset trained from scratch,
    `diff A ""` read the working directory as B. An optional flag's default is None, which
    becomes "" (not given) here."""
    from profiler.errors import UsageError

    for name, attr in names.items():
        value = getattr(args, attr)
        if value is None:
            setattr(args, attr, "")
        elif any(not str(v).strip() for v in (value if isinstance(value, list) else [value])):
            raise UsageError(
                f"{name} is empty; " + ("give a value or leave the flag out" if name[0] == "-" else "give a path")
            )
