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
