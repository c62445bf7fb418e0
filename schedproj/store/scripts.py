"""Load the Lua scripts shipped in ``schedproj/store/lua`` and register them with a client."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import Any

import redis

#: A line ``-- include: NAME`` in a script is replaced by ``lua/NAME.lua``: Redis runs each
#: script on its own, so a helper several scripts share is spliced in at load time.
_INCLUDE = re.compile(r"^-- include: (\w+)$", re.MULTILINE)


@cache
def source(name: str) -> str:
    text = resources.files("schedproj.store").joinpath("lua", f"{name}.lua").read_text()
    return _INCLUDE.sub(lambda m: source(m.group(1)).rstrip("\n"), text)


def register(client: redis.Redis, name: str) -> Any:
    """A callable script (EVALSHA with a fallback to EVAL), usable in pipelines."""
    return client.register_script(source(name))
