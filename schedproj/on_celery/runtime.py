"""Per-process handles a worker or beat needs: settings, Redis client, keys, lease, store.

Built lazily and re-built after a fork, so a prefork child never shares its parent's sockets.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from schedproj.settings import Settings
from schedproj.store.connection import connect
from schedproj.store.lane_store import LaneStore
from schedproj.store.lease import HeavyLease, SlotGroup
from schedproj.store.protocol import Keys


@dataclass
class Runtime:
    settings: Settings
    keys: Keys
    lease: HeavyLease
    store: LaneStore
    pid: int
    #: The lease on a client of its own whose socket timeout is at most a sixth of the lease
    #: TTL, for a holder's renewals: a renewal stuck on a cut-off link must fail while the
    #: holder can still stop before its lease expires on the server. No retries either: the
    #: renewer tries again at its next interval (a client retrying with backoff, as through
    #: a Sentinel failover, held a renewal for ~9 s and landed it after the run had ended).
    renewal: HeavyLease | None = None
    #: Stores on slot keys (see :meth:`slot_store`), made on first use.
    _slot_stores: dict[str, LaneStore] = field(default_factory=dict, repr=False)

    def slot_group(self, pool: str, slots: Sequence[int], *, renewal: bool = False
                   ) -> SlotGroup:
        """The slot leases of one run in ``pool`` (on the renewal client with ``renewal``)."""
        lease = (self.renewal or self.lease) if renewal else self.lease
        return SlotGroup(lease.client, self.keys, pool, slots)

    def slot_store(self, keys: Keys) -> LaneStore:
        """The lane store whose lease is the slot of ``keys``: a run's end recorded through it
        releases that slot, atomically with the record, and wakes beat."""
        if keys.lease == self.keys.lease:
            return self.store
        store = self._slot_stores.get(keys.lease)
        if store is None:
            store = self._slot_stores[keys.lease] = LaneStore(
                self.store.client, keys, self.store.audit_client,
                compact_records=self.store.compact_records)
        return store

    @classmethod
    def build(cls, settings: Settings) -> Runtime:
        client = connect(settings.state_redis_url, tls=settings.redis_tls)
        audit = connect(settings.audit_redis_url, tls=settings.redis_tls) \
            if settings.audit_redis_url else client
        keys = Keys(settings.key_prefix)
        renewal = connect(settings.state_redis_url, tls=settings.redis_tls,
                          socket_timeout_s=renewal_timeout_s(settings.lease_ttl_s),
                          retry=False)
        return cls(settings=settings, keys=keys, lease=HeavyLease(client, keys),
                   store=LaneStore(client, keys, audit,
                                   compact_records=settings.compact_records),
                   pid=os.getpid(),
                   renewal=HeavyLease(renewal, keys))


def renewal_timeout_s(lease_ttl_s: float) -> float:
    """Socket timeout of the renewal client: a sixth of the lease TTL (at most 10 s)."""
    return min(10.0, lease_ttl_s / 6)


_lock = threading.Lock()
_runtimes: dict[int, Runtime] = {}


def settings_for(app: Any) -> Settings:
    """The settings an app was configured with (see
    :func:`schedproj.on_celery.config.configure_app`)."""
    settings = getattr(app, "schedproj_settings", None)
    if settings is None:
        settings = Settings.load()
        app.schedproj_settings = settings
    assert isinstance(settings, Settings)
    return settings


def runtime_for(app: Any) -> Runtime:
    """This process's runtime for ``app``."""
    key = id(app)
    with _lock:
        rt = _runtimes.get(key)
        if rt is None or rt.pid != os.getpid():
            rt = Runtime.build(settings_for(app))
            _runtimes[key] = rt
        return rt
