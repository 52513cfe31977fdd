"""Reports: what a run produced, for people. They read what the store wrote and
the finished request runtimes, never live runtime objects mid-run.

- ``terminal``: the per-request section at the end of the pytest terminal output.
- ``baseline``: baseline files, run directories as baselines, what changed between two runs.
- ``gates``: minimum values of aggregate metrics, checked by name and by value.
- ``html``: the self-contained HTML page of a run directory or a session.
- ``cli``: ``python -m pytest_agentcompass report|compare``.
"""
