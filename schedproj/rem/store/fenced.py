"""One fenced write of the REM store: the commands ``rem_fenced_write.lua`` applies in one
atomic step after checking the fence (see :mod:`schedproj.rem.store`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

#: Longest argument list one Redis command in a fenced write gets; longer ones are split so a
#: big write never hits Lua's unpack limit.
_MAX_ARGS_PER_COMMAND = 512


class FencedWrite:
    """The commands of one atomic fenced write, with the keys they touch."""

    def __init__(self, fence_key: str) -> None:
        self.keys: list[str] = [fence_key]
        self._index: dict[str, int] = {fence_key: 1}
        self.args: list[str | int | float] = []

    def __bool__(self) -> bool:
        return bool(self.args)

    def op(self, command: str, key: str, *args: str | int | float) -> None:
        index = self._index.get(key)
        if index is None:
            self.keys.append(key)
            index = self._index[key] = len(self.keys)
        self.args += [command, index, len(args), *args]

    def variadic(self, command: str, key: str, args: Sequence[str | int | float],
                 *, step: int = 1) -> None:
        """``command key arg...`` split into bounded chunks (``step`` keeps pairs whole)."""
        size = _MAX_ARGS_PER_COMMAND - _MAX_ARGS_PER_COMMAND % step
        for start in range(0, len(args), size):
            self.op(command, key, *args[start:start + size])

    def hset(self, key: str, mapping: Mapping[str, str | int]) -> None:
        flat: list[str | int | float] = []
        for fld, value in mapping.items():
            flat += [fld, value]
        self.variadic("HSET", key, flat, step=2)
