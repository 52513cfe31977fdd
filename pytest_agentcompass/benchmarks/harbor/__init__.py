"""Harbor / Terminal-Bench 2 task directories as a benchmark (id ``harbor``)."""

from .benchmark import HarborBenchmark, HarborParams
from .taskdir import HarborTask, read_task

__all__ = ["HarborBenchmark", "HarborParams", "HarborTask", "read_task"]
