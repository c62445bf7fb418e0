"""Every key of the REM chain's memory, named once: :class:`RemKeys`."""

from __future__ import annotations

from dataclasses import dataclass

#: The write stamp's key relative to the deployment's key prefix (how a ``DueCheckStamp``
#: names it): ``<prefix>:rem:write-stamp``.
WRITE_STAMP_KEY = "rem:write-stamp"


@dataclass(frozen=True)
class RemKeys:
    """Every REM key name under one prefix. ``RemKeys("p").fence == "p:rem:fence"``."""

    prefix: str

    @property
    def base(self) -> str:
        return f"{self.prefix}:rem"

    @property
    def pattern(self) -> str:
        """Glob matching every REM key (for SCAN)."""
        return f"{self.base}:*"

    @property
    def fence(self) -> str:
        """Integer: the highest fencing number that has written. Never decreases."""
        return f"{self.base}:fence"

    @property
    def sessions(self) -> str:
        """Hash: session id -> JSON ``{"turns": n, "words": w}``."""
        return f"{self.base}:sessions"

    def turns(self, session_id: str) -> str:
        """List: the session's turn texts, in order."""
        return f"{self.base}:turns:{session_id}"

    def minis(self, session_id: str) -> str:
        """Hash: turn index -> that turn's mini-summary."""
        return f"{self.base}:minis:{session_id}"

    @property
    def summaries(self) -> str:
        """Hash: session id -> JSON :class:`Summary`."""
        return f"{self.base}:summaries"

    @property
    def undigested(self) -> str:
        """Set: session ids whose summary the dream has not digested yet."""
        return f"{self.base}:undigested"

    @property
    def session_nodes(self) -> str:
        """Set: session nodes of the graph."""
        return f"{self.base}:graph:sessions"

    @property
    def concept_nodes(self) -> str:
        """Set: concept nodes of the graph."""
        return f"{self.base}:graph:concepts"

    @property
    def session_edges(self) -> str:
        """Hash: ``<session id>|<concept>`` -> weight (term frequency in the summary)."""
        return f"{self.base}:graph:session-edges"

    @property
    def concept_edges(self) -> str:
        """Hash: ``<concept a>|<concept b>`` (a < b) -> co-occurrence count."""
        return f"{self.base}:graph:concept-edges"

    @property
    def graph_version(self) -> str:
        """Integer: bumped once per digested batch; the golden path records the one it used."""
        return f"{self.base}:graph:version"

    @property
    def cycles(self) -> str:
        """List: JSON :class:`Cycle` records, newest first, at most :data:`RECENT_CYCLES`."""
        return f"{self.base}:cycles"

    @property
    def golden_path(self) -> str:
        """String: JSON :class:`GoldenPath`."""
        return f"{self.base}:golden-path"

    @property
    def pulse(self) -> str:
        """String: JSON :class:`Pulse`, the heartbeat."""
        return f"{self.base}:pulse"

    @property
    def backfill_backoff_until(self) -> str:
        """String (epoch seconds): the backfill lane backs off until then after a run that
        made no progress (``MemoryStore.put_backfill_backoff``)."""
        return f"{self.base}:backfill-backoff-until"

    @property
    def write_stamp(self) -> str:
        """String: a fresh random token, set by every write in the same atomic step (and by
        a restore): beat calls the REM due checks again only when it moved (``Lane``'s
        ``due_check_stamp``)."""
        return f"{self.prefix}:{WRITE_STAMP_KEY}"

    def fixed(self) -> tuple[str, ...]:
        """The keys that exist once per store (not per session)."""
        return (self.fence, self.sessions, self.summaries, self.undigested, self.session_nodes,
                self.concept_nodes, self.session_edges, self.concept_edges, self.graph_version,
                self.cycles, self.golden_path, self.pulse, self.backfill_backoff_until,
                self.write_stamp)

    def session_keys(self, session_id: str) -> tuple[str, str]:
        return self.turns(session_id), self.minis(session_id)

    def redis_type(self, name: str) -> str | None:
        """The Redis type a REM key has by construction, or None for a name we never write."""
        fixed = {self.fence: "string", self.sessions: "hash", self.summaries: "hash",
                 self.undigested: "set", self.session_nodes: "set", self.concept_nodes: "set",
                 self.session_edges: "hash", self.concept_edges: "hash",
                 self.graph_version: "string", self.cycles: "list",
                 self.golden_path: "string", self.pulse: "string",
                 self.backfill_backoff_until: "string", self.write_stamp: "string"}
        if name in fixed:
            return fixed[name]
        if name.startswith(self.turns("")):
            return "list"
        if name.startswith(self.minis("")):
            return "hash"
        return None
