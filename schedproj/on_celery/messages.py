"""What beat adds to a lane's message, and how a worker reads it back.

Every message carries the fence of the beat lock under which it was sent, so a worker can
refuse a message from a beat that has lost its lock since; the message's task id is its
dispatch token (a light run starts only if the sched record names it). A heavy message also
carries its lease grant. The lane body never sees these keywords: ``LaneTask`` pops them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Keyword argument that carries the lease grant in a heavy lane's message.
LEASE_KWARG = "schedproj_lease"
#: Keyword argument that carries the dispatching beat's fence in a light lane's message.
DISPATCH_KWARG = "schedproj_dispatch"


@dataclass(frozen=True)
class Dispatch:
    """What a worker learns from a message: the lease token and fence (heavy), the beat's."""

    beat_fence: int | None
    #: Kept out of repr: a traceback's frame variables reach logs and Sentry.
    lease_token: str | None = field(default=None, repr=False)
    lease_fence: int = 0


def heavy_kwargs(token: str, fence: int, beat_fence: int) -> dict[str, Any]:
    return {LEASE_KWARG: {"token": token, "fence": fence, "beat_fence": beat_fence}}


def light_kwargs(beat_fence: int) -> dict[str, Any]:
    return {DISPATCH_KWARG: {"beat_fence": beat_fence}}


def pop_dispatch(kwargs: dict[str, Any]) -> Dispatch | None:
    """Take schedproj's keywords out of ``kwargs``; None when the message has none (not sent
    by beat: a forged or hand-made message)."""
    grant = kwargs.pop(LEASE_KWARG, None)
    light = kwargs.pop(DISPATCH_KWARG, None)
    source = grant if isinstance(grant, dict) else light if isinstance(light, dict) else None
    if source is None:
        return None
    fence = source.get("beat_fence")
    beat_fence = fence if isinstance(fence, int) and not isinstance(fence, bool) else None
    if source is grant:
        token = grant.get("token")
        lease_fence = grant.get("fence")
        return Dispatch(beat_fence=beat_fence,
                        lease_token=token if isinstance(token, str) and token else None,
                        lease_fence=lease_fence if isinstance(lease_fence, int) else 0)
    return Dispatch(beat_fence=beat_fence)


__all__ = ["DISPATCH_KWARG", "LEASE_KWARG", "Dispatch", "heavy_kwargs", "light_kwargs",
           "pop_dispatch"]
