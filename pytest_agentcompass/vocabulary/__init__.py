"""The words every layer shares: the spec's data types, errors, secret redaction,
the artifact sink's contract and the agent install recipe a harness hands a provider.

Nothing here imports another part of the package (the config, in ``config/``,
builds on these).
"""
