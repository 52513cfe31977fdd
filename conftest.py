"""Root conftest: the test suite drives pytest itself through ``pytester``."""

collect_ignore = ["example_suites", "perf"]
