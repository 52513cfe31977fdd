"""Analyzers: code that reads a finished task's result and adds findings (``BaseAnalyzer`` in :mod:`.base`)."""
