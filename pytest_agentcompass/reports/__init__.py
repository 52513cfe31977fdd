"""Reports: what a run produced, for people. They read what the store wrote and
the finished request runtimes, never live runtime objects mid-run.

- ``terminal``: the per-request section at the end of the pytest terminal output.
"""
