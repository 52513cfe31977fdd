"""Benchmarks: the base classes (:mod:`.base`), the evidence helpers verifiers share
(:mod:`.evidence`), and one folder per task format (``harbor/``)."""
