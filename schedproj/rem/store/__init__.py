"""The REM chain's memory on Redis: sessions of turns, mini-summaries, session summaries, the
graph, dream cycles, the golden path and the heartbeat pulse.

Every key lives under ``<prefix>:rem:`` and is named in :class:`RemKeys`, nowhere else.

Writes are fenced. A heavy lane writes under its lease's fencing number; the store keeps the
highest fence seen and one Lua script (``rem_fenced_write.lua``) checks it and applies all of
a logical write's commands in one atomic step (Redis runs a script like a MULTI/EXEC block), so
a run whose lease was taken over can never land a write after its successor wrote. Fence 0
means "unfenced": allowed for light-lane writes (golden path, heartbeat) and for ingest.

Reads are cheap and at worst O(sessions), in one or two round trips.

Split like :mod:`schedproj.store`: the key names (``keys``), the records and their decoding
(``records``), one fenced write (``fenced``) and the store itself (``memory``).
"""

from schedproj.rem.store.keys import RemKeys
from schedproj.rem.store.memory import DEFAULT_WINDOW_WORDS, RECENT_CYCLES, MemoryStore
from schedproj.rem.store.records import (
    Cycle,
    GoldenPath,
    Graph,
    GraphDelta,
    PendingTurn,
    Pulse,
    RankedConcept,
    RemCounts,
    SessionMeta,
    Summary,
    concept_pairs,
)

__all__ = [
    "DEFAULT_WINDOW_WORDS",
    "RECENT_CYCLES",
    "Cycle",
    "GoldenPath",
    "Graph",
    "GraphDelta",
    "MemoryStore",
    "PendingTurn",
    "Pulse",
    "RankedConcept",
    "RemCounts",
    "RemKeys",
    "SessionMeta",
    "Summary",
    "concept_pairs",
]
