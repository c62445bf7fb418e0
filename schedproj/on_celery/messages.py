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
    #: The pool beyond the default whose slots the grant is for, and which slots (None: the
    #: heavy lease, the default pool's one slot).
    pool: str | None = None
    slots: tuple[int, ...] = ()


def heavy_kwargs(token: str, fence: int, beat_fence: int, *, pool: str | None = None,
                 slots: tuple[int, ...] = ()) -> dict[str, Any]:
    """A heavy message's grant: the heavy lease's, or (``pool``) the slots of a pool beyond
    the default (a default-pool message is exactly what it was before pools)."""
    grant: dict[str, Any] = {"token": token, "fence": fence, "beat_fence": beat_fence}
    if pool is not None:
        grant.update(pool=pool, slots=list(slots))
    return {LEASE_KWARG: grant}


#: What a lease grant's token is shown as wherever the message is shown.
HIDDEN_TOKEN = "<hidden>"


def shown_kwargs(kwargs: dict[str, Any]) -> str:
    """``kwargs`` as the message's ``kwargsrepr`` shows them (Flower, the task-sent and
    received events, the worker's "Received task" log line): a lease grant's token hidden,
    since whoever holds it can act as the run's holder (renew, release, finish), and those
    views reach people and places that have no business with the lease. Also spares beat
    Celery's ``saferepr`` of the grant (about 50 µs on the hand-off's path)."""
    grant = kwargs.get(LEASE_KWARG)
    if not isinstance(grant, dict) or "token" not in grant:
        return repr(kwargs)
    return repr({**kwargs, LEASE_KWARG: {**grant, "token": HIDDEN_TOKEN}})


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
        pool, slots = slots_of(grant)
        return Dispatch(beat_fence=beat_fence,
                        lease_token=token if isinstance(token, str) and token else None,
                        lease_fence=lease_fence if isinstance(lease_fence, int) else 0,
                        pool=pool, slots=slots)
    return Dispatch(beat_fence=beat_fence)


def slots_of(grant: dict[str, Any]) -> tuple[str | None, tuple[int, ...]]:
    """The pool and slots a grant names. A grant naming a pool without usable slots names
    the pool with none: its run is refused (it can start under no slot lease)."""
    pool = grant.get("pool")
    if not isinstance(pool, str) or not pool:
        return None, ()
    slots = grant.get("slots")
    if not (isinstance(slots, list) and slots and all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in slots)):
        return pool, ()
    return pool, tuple(slots)


__all__ = ["DISPATCH_KWARG", "HIDDEN_TOKEN", "LEASE_KWARG", "Dispatch", "heavy_kwargs",
           "light_kwargs", "pop_dispatch", "shown_kwargs", "slots_of"]
