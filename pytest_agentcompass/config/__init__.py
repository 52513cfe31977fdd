"""The config file: its schema (:mod:`.schema`, with the two schemas of ``model.params`` in
:mod:`.model_params`) and loading it (:mod:`.loading`: variables, validation, file and line in
errors, on the YAML :mod:`.yaml_text` reads and checks)."""

from __future__ import annotations

from .loading import VARIABLE, LoadedConfig, expand_variables, load_config
from .schema import (
    MAX_STORED_CHARS,
    SAFE_NAME,
    AttemptsSpec,
    ComponentRef,
    ConfigPath,
    EnvironmentSpec,
    ExecutionSpec,
    ModelSpec,
    NetworkSpec,
    Orchestration,
    ParamsModel,
    RunRequest,
    TimeoutsSpec,
)
from .yaml_text import format_loc

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
