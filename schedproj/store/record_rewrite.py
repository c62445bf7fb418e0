"""Rewrite every lane's run and sched records in one format (``schedproj records --to``): the
step before rolling back below the release that introduced the compact format (a release that
reads only the long one refuses a compact record: core/records.py), or, the other way, to
compact the records already stored once ``SCHEDPROJ_COMPACT_RECORDS`` is on everywhere.

Each record is decoded and encoded again in the target format (the same values: its times
were rounded to the microsecond when first written, and rounding them again changes nothing)
and written by compare and set (``lua/run_cas.lua``, no dispatch check): a record changed
meanwhile by beat or a worker is left to its writer and counted, so a second pass picks it up.
Records already in the target format are not touched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import redis

from schedproj.core.errors import StateError
from schedproj.core.records import (
    COMPACT_FORMAT,
    LONG_FORMAT,
    RunRecord,
    SchedRecord,
    decode_with_format,
    encode,
)
from schedproj.store import scripts
from schedproj.store.protocol import Keys

#: Fields read (HSCAN's COUNT hint) and compared-and-set (one pipeline) a round.
REWRITE_PAGE = 1000

_KINDS: dict[str, Any] = {"run": RunRecord, "sched": SchedRecord}


@dataclass
class RewriteCounts:
    """What a pass did: records rewritten, already in the format, changed meanwhile by their
    writer (left: run the pass again), unreadable (left untouched: the key and problem)."""

    rewritten: int = 0
    already: int = 0
    changed: int = 0
    unreadable: list[str] = field(default_factory=list)


def rewrite_records(client: redis.Redis, keys: Keys, *, compact: bool,
                    dry_run: bool = False) -> RewriteCounts:
    """Rewrite every run and sched record not in the target format (compact, or long) in it;
    with ``dry_run`` only count them (as ``rewritten``)."""
    target = COMPACT_FORMAT if compact else LONG_FORMAT
    cas = scripts.register(client, "run_cas")
    counts = RewriteCounts()
    page: list[tuple[str, str, str]] = []
    for name, raw in client.hscan_iter(keys.lanes, count=REWRITE_PAGE):
        field_name = str(name)
        kind = field_name.rpartition("|")[2]
        cls = _KINDS.get(kind)
        if cls is None:
            continue
        text = raw if isinstance(raw, str) else raw.decode()
        try:
            version, record = decode_with_format(cls, text, f"{keys.lanes} field {field_name!r}")
        except StateError as exc:
            counts.unreadable.append(str(exc))
            continue
        if version == target:
            counts.already += 1
            continue
        page.append((field_name, text, encode(record, compact=compact)))
        if len(page) >= REWRITE_PAGE:
            _write(client, keys, cas, page, counts, dry_run)
            page = []
    _write(client, keys, cas, page, counts, dry_run)
    return counts


def _write(client: redis.Redis, keys: Keys, cas: Any, page: list[tuple[str, str, str]],
           counts: RewriteCounts, dry_run: bool) -> None:
    if not page:
        return
    if dry_run:
        counts.rewritten += len(page)
        return
    pipe = client.pipeline(transaction=False)
    for field_name, expected, new in page:
        lane = field_name.rpartition("|")[0]
        cas(keys=[keys.lanes, keys.beat_fence, keys.changed, keys.epoch],
            args=[field_name, expected, new, "", "", "", lane, ""], client=pipe)
    for code, _ in pipe.execute():
        if int(code) == 1:
            counts.rewritten += 1
        else:
            counts.changed += 1


__all__ = ["REWRITE_PAGE", "RewriteCounts", "rewrite_records"]
