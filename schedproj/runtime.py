"""Per-process handles a worker or beat needs: settings, Redis client, keys, lease, store.

Built lazily and re-built after a fork, so a prefork child never shares its parent's sockets.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

from schedproj.keys import Keys
from schedproj.lease import HeavyLease
from schedproj.redis_conn import connect
from schedproj.settings import Settings
from schedproj.store import LaneStore


@dataclass
class Runtime:
    settings: Settings
    keys: Keys
    lease: HeavyLease
    store: LaneStore
    pid: int

    @classmethod
    def build(cls, settings: Settings) -> Runtime:
        client = connect(settings.state_redis_url)
        audit = connect(settings.audit_redis_url) if settings.audit_redis_url else client
        keys = Keys(settings.key_prefix)
        return cls(settings=settings, keys=keys, lease=HeavyLease(client, keys),
                   store=LaneStore(client, keys, audit), pid=os.getpid())


_lock = threading.Lock()
_runtimes: dict[int, Runtime] = {}


def settings_for(app: Any) -> Settings:
    """The settings an app was configured with (see :func:`schedproj.config.configure_app`)."""
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
