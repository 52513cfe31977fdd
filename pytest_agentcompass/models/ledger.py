"""The model calls of one attempt: what each cost, and whether the attempt's budget is spent.

One ledger per attempt (per try of it, when a runtime retry replaces one),
whoever calls the model: the ``openai`` and ``shell-agent`` harnesses record
their calls from this process, the model gateway records what passes through
it for an agent CLI in a container. Usage, cost, the token budget and the
trajectory therefore mean the same for every agent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .usage import Usage

__all__ = ["PROTOCOLS", "CallLedger", "ModelCall", "Protocol"]

#: The model APIs a call may speak.
Protocol = Literal["openai_chat", "openai_responses", "anthropic", "gemini"]
PROTOCOLS: tuple[Protocol, ...] = ("openai_chat", "openai_responses", "anthropic", "gemini")


@dataclass
class ModelCall:
    """One model request and what came of it.

    ``usage`` holds ``prompt_tokens``, ``completion_tokens`` and
    ``total_tokens`` as the endpoint reported them (``None`` when it reported
    none), plus ``cached_tokens`` / ``reasoning_tokens`` when it named those.
    ``status`` is the upstream's HTTP status, ``None`` when no answer came
    (unreachable, cut off). ``sent`` is False for a call that never reached the
    upstream (refused by the budget, the upstream unreachable, the agent gone
    before it was sent): it is not counted in ``usage.calls``. ``message`` is the answer as an assistant message
    in chat-completions form, whatever the protocol, when it could be read.
    """

    protocol: Protocol
    model: str | None
    status: int | None = 200
    latency: float = 0.0
    usage: dict[str, int] | None = None
    error: str | None = None
    stream: bool = False
    sent: bool = True
    finish_reason: str | None = None
    message: dict[str, Any] | None = None
    #: Bodies as recorded for the trajectory (bounded by whoever recorded them).
    request: Any = None
    response: Any = None
    #: Facts of the transport (the path, the model the agent asked for when another was sent, ...).
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300 and self.error is None


class CallLedger:
    """Every call of one attempt, their usage, and the attempt's token and cost budget.

    ``usage.calls`` counts every call sent upstream, whatever its end (an
    error, a cut, an agent that hung up): the upstream served each. The tokens
    count whatever a call reported, an answer cut short included; a call that
    should have reported usage and did not (no answer, or a 2xx one without
    its usage) is counted in ``usage.calls_without_usage`` instead of as zero
    tokens. An error answer (4xx/5xx) reports none and costs none.
    """

    def __init__(
        self,
        *,
        input_price_per_million: float | None = None,
        output_price_per_million: float | None = None,
        max_total_tokens: int | None = None,
        max_cost: float | None = None,
    ) -> None:
        self.calls: list[ModelCall] = []
        self.usage = Usage()
        self.prices = (input_price_per_million, output_price_per_million)
        self.max_total_tokens = max_total_tokens
        self.max_cost = max_cost
        #: Calls refused because the budget was spent.
        self.refused = 0

    def record(self, call: ModelCall) -> None:
        self.calls.append(call)
        counts = call.usage
        if call.sent:
            self.usage.calls += 1
            if counts is None and (call.status is None or 200 <= call.status < 300):
                self.usage.calls_without_usage += 1
        if counts is not None:
            self.usage.add_tokens(counts["prompt_tokens"], counts["completion_tokens"], counts.get("total_tokens"))
        self.usage.price(*self.prices)

    def spent(self) -> str | None:
        """Why the budget allows no further call, or ``None`` while it does.

        Reported tokens only: a call without usage adds nothing it could be
        checked against (no estimate would be right for every model); the usage
        says how many there were (``calls_without_usage``).
        """
        used = self.usage.total_tokens
        if self.max_total_tokens is not None and used >= self.max_total_tokens:
            return f"the token budget of this attempt is spent ({used} of {self.max_total_tokens} tokens used)"
        cost = self.usage.cost
        if self.max_cost is not None and cost is not None and cost >= self.max_cost:
            return f"the cost budget of this attempt is spent ({cost:.4f} of {self.max_cost:g} used)"
        return None
