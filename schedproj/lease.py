"""The one fleet-wide heavy lease, on Redis.

Granted with ``SET NX PX`` and a fencing number that only ever increases; started, renewed and
released by compare-and-set on the owner token (Lua), never blindly. The TTL is short and
renewed while a run holds the lease, so a killed holder frees it in seconds; renewal stops at
the maximum hold, the backstop for a run that never yields.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import redis

from schedproj import scripts
from schedproj.keys import Keys
from schedproj.state import LeaseView, decode


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


@dataclass(frozen=True)
class Grant:
    """The answer to an acquisition: ``fence`` when granted, else who holds it."""

    granted: bool
    fence: int = 0
    holder: str | None = None
    not_active_beat: bool = False


class HeavyLease:
    """Operations on the heavy lease for one key prefix."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self._acquire = scripts.register(client, "lease_acquire")
        self._start = scripts.register(client, "lease_start")
        self._renew = scripts.register(client, "lease_renew")
        self._release = scripts.register(client, "lease_release")

    def acquire(self, lane: str, token: str, ttl_s: float, now: float, *, task_id: str = "",
                beat_token: str = "") -> Grant:
        """Grant the lease to ``lane`` unless held; with ``beat_token`` only for the active
        beat."""
        code, value = self._acquire(
            keys=[self.keys.lease, self.keys.lease_fence, self.keys.beat_lock,
                  self.keys.counters],
            args=[token, lane, _ms(ttl_s), repr(now), task_id, beat_token, int(now * 1000)],
        )
        if int(code) == 1:
            return Grant(granted=True, fence=int(value))
        if int(code) == -1:
            return Grant(granted=False, not_active_beat=True)
        return Grant(granted=False, holder=str(value))

    def start(self, token: str, ttl_s: float, now: float) -> tuple[bool, int | str]:
        """Mark the run started under ``token``: (True, fence) or (False, reason)."""
        code, value = self._start(keys=[self.keys.lease], args=[token, _ms(ttl_s), repr(now)])
        return (True, int(value)) if int(code) == 1 else (False, str(value))

    def renew(self, token: str, ttl_s: float, now: float, max_hold_s: float) -> tuple[bool, str]:
        code, reason = self._renew(
            keys=[self.keys.lease], args=[token, _ms(ttl_s), repr(now), repr(max_hold_s)]
        )
        return int(code) == 1, str(reason)

    def release(self, token: str) -> bool:
        return int(self._release(keys=[self.keys.lease], args=[token])) == 1

    def read(self) -> LeaseView | None:
        raw = self.client.get(self.keys.lease)
        return parse_lease(raw if raw is None else str(raw), self.keys.lease)

    def current_fence(self) -> int:
        return int(self.client.get(self.keys.lease_fence) or 0)


def parse_lease(raw: str | None, key: str) -> LeaseView | None:
    """Decode the lease record (written by Lua, so numbers may come back as floats)."""
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        if isinstance(data, dict) and isinstance(data.get("fence"), float):
            data["fence"] = int(data["fence"])
        raw = json.dumps(data)
    except ValueError:
        pass
    return decode(LeaseView, raw, key)


__all__ = ["Grant", "HeavyLease", "parse_lease"]
