"""Load the Lua scripts shipped in ``schedproj/lua`` and register them with a client."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import redis


@cache
def source(name: str) -> str:
    return resources.files("schedproj").joinpath("lua", f"{name}.lua").read_text()


def register(client: redis.Redis, name: str) -> Any:
    """A callable script (EVALSHA with a fallback to EVAL), usable in pipelines."""
    return client.register_script(source(name))
