"""Capture what sentry-sdk would send, without a network.

sentry-sdk hands every envelope (error events, Crons check-ins, client reports) to its
transport. These transports record each envelope item instead of sending it:

* :class:`MemoryTransport` keeps them in a list (in-process tests);
* :class:`RedisCaptureTransport` RPUSHes each item as JSON to a Redis list, so a test can read
  what real beat and worker processes (prefork children included) would have sent.

A real process cannot be handed a transport object through its environment, so
:func:`activate_from_env` (called by the lane module of the ``sentry`` end-to-end scenario,
which beat and workers import before they initialise Sentry) makes the capturing transport the
default of ``sentry_sdk.init`` in that process when ``E2E_SENTRY_CAPTURE`` names a Redis list.
Everything else is the product's own path: ``SENTRY_DSN`` in the environment, ``init_sentry``
from beat's ``setup_schedule`` and the workers' ``worker_init``/``worker_process_init``, the
Celery integration's check-ins and error capture. Only the last hop (HTTP to Sentry) is swapped.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from typing import Any

import redis
import sentry_sdk
from sentry_sdk.envelope import Envelope, Item
from sentry_sdk.transport import Transport

#: Environment variable naming the Redis list that receives the captured items.
ENV_KEY = "E2E_SENTRY_CAPTURE"
#: The Redis holding that list (default: the state Redis of the process under test).
ENV_URL = "E2E_SENTRY_CAPTURE_URL"


def item_record(item: Item) -> dict[str, Any]:
    """One envelope item as plain JSON: its type and its payload."""
    payload: Any = item.payload.json
    if payload is None:
        raw = item.payload.get_bytes()
        try:
            payload = json.loads(raw)
        except ValueError:
            payload = raw.decode("utf-8", "replace")
    return {"type": item.type, "payload": payload}


def _process() -> str:
    """``beat`` or ``worker:<node name>`` from this process's command line."""
    argv = sys.argv
    if "beat" in argv:
        return "beat"
    if "-n" in argv and argv.index("-n") + 1 < len(argv):
        return "worker:" + argv[argv.index("-n") + 1].split("@")[0]
    return "worker" if "worker" in argv else "other"


class MemoryTransport(Transport):
    """Keeps every envelope item in :attr:`items`."""

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        self.items: list[dict[str, Any]] = []

    def capture_envelope(self, envelope: Envelope) -> None:
        self.items.extend(item_record(item) for item in envelope.items)

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [x["payload"] for x in self.items if x["type"] == kind]


class RedisCaptureTransport(Transport):
    """RPUSHes every envelope item (with the sending process) to the list ``E2E_SENTRY_CAPTURE``.

    On creation it also pushes a ``_client`` record with the options a test must check
    (never the DSN itself)."""

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        self.key = os.environ[ENV_KEY]
        url = os.environ.get(ENV_URL) or os.environ["SCHEDPROJ_REDIS_URL"]
        self.client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        opts = options or {}
        self._push({
            "type": "_client",
            "payload": {
                "send_default_pii": opts.get("send_default_pii"),
                "environment": opts.get("environment"),
                "release": opts.get("release"),
                "has_dsn": bool(opts.get("dsn")),
                "integrations": sorted(type(i).__name__ for i in opts.get("integrations", [])),
            },
        })

    def _push(self, record: dict[str, Any]) -> None:
        record.update(pid=os.getpid(), process=_process())
        self.client.rpush(self.key, json.dumps(record, default=str))

    def capture_envelope(self, envelope: Envelope) -> None:
        for item in envelope.items:
            self._push(item_record(item))


def activate_from_env() -> bool:
    """If ``E2E_SENTRY_CAPTURE`` is set, make every later ``sentry_sdk.init`` in this process
    (and its forked children) use :class:`RedisCaptureTransport`. Idempotent."""
    if not os.environ.get(ENV_KEY):
        return False
    if getattr(sentry_sdk.init, "_e2e_capture", False):
        return True
    original = sentry_sdk.init

    @functools.wraps(original)
    def init(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("transport", RedisCaptureTransport)
        return original(*args, **kwargs)

    init._e2e_capture = True  # type: ignore[attr-defined]
    sentry_sdk.init = init  # type: ignore[misc,assignment]  # a class to mypy
    return True


def read_captured(client: redis.Redis, key: str) -> list[dict[str, Any]]:
    """Every record pushed to ``key`` so far, oldest first."""
    return [json.loads(x) for x in client.lrange(key, 0, -1)]
