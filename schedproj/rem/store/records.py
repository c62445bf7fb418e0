"""The records of the REM chain's memory and how they are encoded and read back: every
decoder refuses what it does not recognise with a StateError naming the key."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from schedproj.core import codec
from schedproj.core.defaults import STATE_VERSION
from schedproj.core.errors import StateError


@dataclass(frozen=True)
class SessionMeta:
    turns: int
    words: int


@dataclass(frozen=True)
class PendingTurn:
    """A turn of an over-window session that still lacks its mini-summary."""

    session_id: str
    index: int
    text: str


@dataclass(frozen=True)
class Summary:
    text: str
    created_at: float
    #: Written from the session's mini-summaries (the session was over the window).
    from_minis: bool


@dataclass(frozen=True)
class Graph:
    """The whole graph, read in one transaction."""

    version: int
    session_nodes: frozenset[str]
    concept_nodes: frozenset[str]
    #: (session id, concept) -> weight
    session_edges: Mapping[tuple[str, str], int]
    #: (concept a, concept b), a < b -> weight
    concept_edges: Mapping[tuple[str, str], int]


@dataclass(frozen=True)
class GraphDelta:
    """What one dream batch adds to the graph."""

    #: New session nodes (not already in the graph).
    sessions: tuple[str, ...]
    #: Concepts the new sessions mention (new or already known).
    concepts: tuple[str, ...]
    #: (session id, concept) -> weight, set.
    session_edges: Mapping[tuple[str, str], int]
    #: (concept a, concept b), a < b -> weight, added to the existing weight.
    concept_edges: Mapping[tuple[str, str], int]
    #: Session ids to take out of the undigested set (digested or undigestible).
    digested: tuple[str, ...]


@dataclass(frozen=True)
class Cycle:
    """One dream cycle: a digested batch and the graph size after it."""

    at: float
    digested: int
    session_nodes: int
    concept_nodes: int
    graph_version: int


@dataclass(frozen=True)
class RankedConcept:
    concept: str
    score: float
    structural: float
    semantic: float


@dataclass(frozen=True)
class GoldenPath:
    #: The graph version the ranking was computed from.
    graph_version: int
    computed_at: float
    ranking: tuple[RankedConcept, ...]


@dataclass(frozen=True)
class Pulse:
    host: str
    pid: int
    at: float


@dataclass(frozen=True)
class RemCounts:
    """The numbers the original system watched (its forensic anchor: undigested 371, session
    nodes 304, 1,354 summaries, no recent cycles)."""

    sessions: int
    summaries: int
    undigested: int
    session_nodes: int
    concept_nodes: int
    edges: int
    graph_version: int
    golden_path_version: int
    backfill_backlog: int
    unsummarized: int
    recent_cycles: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


# -- encoding --------------------------------------------------------------------------------

def encode(record: Any) -> str:
    return codec.dumps(asdict(record), STATE_VERSION, sort_keys=True)


def decode_object(raw: Any, key: str) -> dict[str, Any]:
    return codec.loads(raw, key, STATE_VERSION)


def decode_meta(raw: Any, key: str) -> SessionMeta:
    data = decode_object(raw, key)
    turns, words = data.get("turns"), data.get("words")
    if (not isinstance(turns, int) or not isinstance(words, int) or not _is_int(turns)
            or not _is_int(words) or set(data) != {"turns", "words"}):
        raise StateError(key, f"expected integer fields turns and words, found {data!r}")
    return SessionMeta(turns=turns, words=words)


def decode_summary(raw: Any, key: str) -> Summary:
    data = decode_object(raw, key)
    text, at, minis = data.get("text"), data.get("created_at"), data.get("from_minis")
    if (not isinstance(text, str) or not isinstance(at, int | float) or not _is_number(at)
            or not isinstance(minis, bool) or set(data) != {"text", "created_at", "from_minis"}):
        raise StateError(key, f"expected text, created_at and from_minis, found {data!r}")
    return Summary(text=text, created_at=float(at), from_minis=minis)


def decode_cycle(raw: Any, key: str) -> Cycle:
    data = decode_object(raw, key)
    try:
        cycle = Cycle(**data)
    except TypeError as exc:
        raise StateError(key, f"bad cycle record ({exc})") from None
    if not all(_is_number(v) for v in asdict(cycle).values()):
        raise StateError(key, f"bad cycle record {data!r}")
    return cycle


def decode_golden_path(raw: Any, key: str) -> GoldenPath:
    data = decode_object(raw, key)
    try:
        ranking = tuple(RankedConcept(**item) for item in data["ranking"])
        path = GoldenPath(graph_version=int(data["graph_version"]),
                          computed_at=float(data["computed_at"]), ranking=ranking)
    except (KeyError, TypeError, ValueError) as exc:
        raise StateError(key, f"bad golden path record ({exc!r})") from None
    return path


def decode_pulse(raw: Any, key: str) -> Pulse:
    data = decode_object(raw, key)
    try:
        return Pulse(host=str(data["host"]), pid=int(data["pid"]), at=float(data["at"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise StateError(key, f"bad pulse record ({exc!r})") from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_number(value: Any) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def read_int(raw: Any, key: str) -> int:
    if raw is None:
        return 0
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise StateError(key, f"expected an integer, found {raw!r}") from None


def edge_map(raw: Mapping[str, str], key: str) -> dict[tuple[str, str], int]:
    edges: dict[tuple[str, str], int] = {}
    for fld, weight in raw.items():
        # Concepts never contain "|", session ids may: split at the last one.
        left, sep, right = fld.rpartition("|")
        if not sep or not left or not right:
            raise StateError(key, f"malformed edge field {fld!r}")
        edges[(left, right)] = read_int(weight, f"{key} field {fld!r}")
    return edges


def concept_pairs(concepts: Iterable[str]) -> list[tuple[str, str]]:
    """Every unordered pair of distinct concepts, each as (smaller, larger), sorted."""
    ordered = sorted(set(concepts))
    return [(a, b) for i, a in enumerate(ordered) for b in ordered[i + 1:]]
