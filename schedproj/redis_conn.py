"""Redis clients built from a URL: credentials and TLS come from the URL, never from code."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import redis


def connect(url: str, *, socket_timeout_s: float = 10.0) -> redis.Redis:
    """A client that decodes to ``str`` and gives up on a dead server instead of hanging."""
    return redis.Redis.from_url(
        url,
        decode_responses=True,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=5.0,
        health_check_interval=30,
    )


def mask(url: str) -> str:
    """The URL with its password replaced, safe for logs and errors."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    netloc = f"{user}:***@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
