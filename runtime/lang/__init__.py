"""Annotation languages: how a model's own tokens declare dependence (PASTA-LANG, TIP registers,
the Planned Diffusion plan language). Each module is a generator of training targets plus an
incremental parser; none imports torch."""
