"""solm: self-orchestrating language models. The `solm` command line lives in `solm.cli`."""

__version__ = "0.1.0"
