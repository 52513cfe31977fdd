"""Model endpoints: settings, the OpenAI-compatible client, usage and cost.

The ``openai`` package is imported only when a client is first built, so a
run that configures no model never pays for it.
"""

from .client import ChatModel, ChatReply, ModelCallError
from .settings import ModelSettings, ResolvedModel, resolve_model
from .trajectory import Trajectory
from .usage import Usage, sum_usage

__all__ = [
    "ChatModel",
    "ChatReply",
    "ModelCallError",
    "ModelSettings",
    "ResolvedModel",
    "Trajectory",
    "Usage",
    "resolve_model",
    "sum_usage",
]
