"""A worker's compare-and-set on its lane's run record: read, change, write only if nobody
wrote in between, retry when somebody did."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from schedproj.core.records import RunRecord
from schedproj.store.lane_store import LaneStore

#: Why a swap gave up: another write landed between its read and its write on every try.
CONTENDED = "contended"


@dataclass(frozen=True)
class Swap:
    """How a :func:`swap_run` ended: ``written``, the record its last try read (``before``),
    and if not written why (the change's own reason, the store's refusal, or
    :data:`CONTENDED`)."""

    written: bool
    before: RunRecord
    reason: str = ""
    #: The ``journal`` entry was appended (with the first compare and set).
    journaled: bool = False


def swap_run(store: LaneStore, lane: str, change: Callable[[RunRecord], RunRecord | str], *,
             tries: int, first: tuple[str | None] | None = None,
             journal: tuple[str, Mapping[str, Any]] | None = None, **cas: Any) -> Swap:
    """Replace ``lane``'s run record with ``change(record)`` by compare and set, at most
    ``tries`` times while another write lands in between. ``change`` returns the new record,
    or a reason (a string) to write nothing. ``cas`` goes to :meth:`LaneStore.cas_run`.
    ``first``: the record as stored, read already (in a 1-tuple; None inside: absent), for the
    first try. ``journal`` (key, entry): appended with the first compare and set, in its
    round trip (:attr:`Swap.journaled`). Raises :class:`StateError` when the stored record
    is unreadable."""
    before = RunRecord()
    journaled = False
    for _ in range(tries):
        if first is not None:
            raw, before = first[0], store.parse_run(lane, first[0])
            first = None
        else:
            raw, before = store.read_run_raw(lane)
        new = change(before)
        if isinstance(new, str):
            return Swap(False, before, new, journaled)
        written, refused = store.cas_run(lane, raw, new, journal=None if journaled else journal,
                                         **cas)
        journaled = journaled or journal is not None
        if written:
            return Swap(True, before, journaled=journaled)
        if refused != "changed":
            return Swap(False, before, refused, journaled)
    return Swap(False, before, CONTENDED, journaled)


__all__ = ["CONTENDED", "Swap", "swap_run"]
