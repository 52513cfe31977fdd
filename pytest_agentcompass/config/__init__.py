"""The config file: its schema (pydantic models) and loading it (YAML, variables, file and line in errors)."""

from __future__ import annotations

from .schema import (
    MAX_STORED_CHARS,
    SAFE_NAME,
    VARIABLE,
    AttemptsSpec,
    ComponentRef,
    ConfigPath,
    EnvironmentSpec,
    ExecutionSpec,
    LoadedConfig,
    ModelSpec,
    NetworkSpec,
    Orchestration,
    ParamsModel,
    RunRequest,
    TimeoutsSpec,
    expand_variables,
    format_loc,
    load_config,
)

__all__ = [
    "MAX_STORED_CHARS",
    "SAFE_NAME",
    "VARIABLE",
    "AttemptsSpec",
    "ComponentRef",
    "ConfigPath",
    "EnvironmentSpec",
    "ExecutionSpec",
    "LoadedConfig",
    "ModelSpec",
    "NetworkSpec",
    "Orchestration",
    "ParamsModel",
    "RunRequest",
    "TimeoutsSpec",
    "expand_variables",
    "format_loc",
    "load_config",
]
