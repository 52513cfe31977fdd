"""Harnesses: the contract and the built-in ``command`` harness."""

from .base import BaseHarness
from .command import CommandHarness

__all__ = ["BaseHarness", "CommandHarness"]
