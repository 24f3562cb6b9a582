"""Value types the serving layer exchanges with the control plane."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from trtspec.decoding.types import DrafterKind, GenerationRequest
from trtspec.wire import Priority, Speculation


class Reason(str, enum.Enum):
    """Reasons a decision can carry besides the routing rules' own (``long_context``, ...)."""

    REQUEST_OFF = "request_off"  # the request said speculation: off
    FORCED_ON = "forced_on"  # the request said speculation: on (router skipped)
    ROLLOUT_OFF = "rollout_off"  # rollout.mode is off
    OFFLINE_ONLY = "offline_only"  # rollout.mode is offline_only and the request is online
    CANARY_EXCLUDED = "canary_excluded"  # rollout.mode is canary and the request is outside it
    BREAKER_OPEN = "breaker_open"  # hard breaker open: nothing speculates
    BREAKER_HALF_OPEN = "breaker_half_open"  # half-open and this request is not one of the probes
    QUOTA = "quota"  # admission: the cap on concurrently speculating requests is reached
    DRAFT_UNAVAILABLE = "draft_unavailable"  # the deployment has no working draft model


@dataclass(frozen=True)
class RequestInfo:
    """What routing needs to know about one request."""

    request_id: str = ""
    context_tokens: int = 0  # prompt length in tokens
    max_new_tokens: int = 0
    priority: Priority = Priority.NORMAL
    speculation: Speculation = Speculation.AUTO
    offline: bool = False  # a batch/offline job (rollout mode offline_only lets only these speculate)
    drafter: DrafterKind = DrafterKind.MODEL  # what drafts for it

    @classmethod
    def from_request(
        cls,
        request: GenerationRequest,
        priority: Priority | str = Priority.NORMAL,
        speculation: Speculation | str = Speculation.AUTO,
        offline: bool = False,
    ) -> RequestInfo:
        return cls(
            request_id=request.request_id,
            context_tokens=len(request.prompt_ids),
            max_new_tokens=request.stop.max_new_tokens,
            priority=Priority(priority),
            speculation=Speculation(speculation),
            offline=offline,
            drafter=request.drafter,
        )


@dataclass(frozen=True)
class RouteDecision:
    """Whether one request speculates, and why (one reason per decision)."""

    speculate: bool
    reason: str  # a routing rule's reason or a Reason value
    breaker_state: str = "closed"  # the breaker state when the decision was made
    probe: bool = False  # admitted as a half-open probe (its outcomes decide whether the breaker closes)

    def to_dict(self) -> dict:
        return {
            "speculate": self.speculate,
            "reason": self.reason,
            "breaker_state": self.breaker_state,
            "probe": self.probe,
        }
