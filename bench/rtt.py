"""Count Redis round trips: every request a redis-py connection writes (one command, or a
whole pipeline) is one round trip."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from redis.connection import AbstractConnection


class RoundTrips:
    """Counts ``send_packed_command`` calls on every redis-py connection of this process."""

    def __init__(self) -> None:
        self.count = 0
        self._original: Any = None

    def install(self) -> None:
        if self._original is not None:
            return
        # redis-py leaves send_packed_command unannotated: say what it is called with.
        original: Callable[..., Any] = AbstractConnection.send_packed_command
        counter = self

        def counting(conn: Any, command: Any, check_health: bool = True) -> Any:
            counter.count += 1
            return original(conn, command, check_health)

        self._original = original
        AbstractConnection.send_packed_command = counting  # type: ignore[method-assign]

    def uninstall(self) -> None:
        if self._original is not None:
            AbstractConnection.send_packed_command = self._original  # type: ignore[method-assign]
            self._original = None

    @contextlib.contextmanager
    def measure(self) -> Iterator[list[int]]:
        """``with rt.measure() as n: ...`` then ``n[0]`` is the round trips inside."""
        box = [0]
        start = self.count
        try:
            yield box
        finally:
            box[0] = self.count - start
