"""Environment providers: the contract and the embedded ``local`` provider."""

from .base import BaseEnvironment, EnvironmentSession, SessionConfig, SessionPurpose
from .local import LocalEnvironment, LocalSession

__all__ = [
    "BaseEnvironment",
    "EnvironmentSession",
    "LocalEnvironment",
    "LocalSession",
    "SessionConfig",
    "SessionPurpose",
]
