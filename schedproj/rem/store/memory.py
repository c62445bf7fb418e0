"""The REM chain's memory store: reads, and fenced writes under a heavy lane's lease."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import redis

from schedproj.core import codec
from schedproj.core.defaults import STATE_VERSION
from schedproj.core.errors import ConfigurationError, LeaseLost
from schedproj.rem.store.fenced import FencedWrite
from schedproj.rem.store.keys import RemKeys
from schedproj.rem.store.records import (
    Cycle,
    GoldenPath,
    Graph,
    GraphDelta,
    PendingTurn,
    Pulse,
    RemCounts,
    SessionMeta,
    Summary,
    decode_cycle,
    decode_golden_path,
    decode_meta,
    decode_pulse,
    decode_summary,
    edge_map,
    encode,
    read_int,
)
from schedproj.rem.text import word_count
from schedproj.store import scripts

#: The model context window, in words: a session with more words than this is "over the
#: window" and is summarized from per-turn mini-summaries instead of its turns.
DEFAULT_WINDOW_WORDS = 1000
#: Dream cycles kept in the recent-cycles list.
RECENT_CYCLES = 20


class MemoryStore:
    """Reads and fenced writes of the REM chain's memory under one key prefix."""

    def __init__(self, client: redis.Redis, prefix: str,
                 window_words: int = DEFAULT_WINDOW_WORDS) -> None:
        if not client.get_connection_kwargs().get("decode_responses"):
            raise ConfigurationError(
                "MemoryStore needs a Redis client that decodes responses to str. Fix: build it "
                "with schedproj.store.connection.connect(url) or decode_responses=True")
        if window_words < 1:
            raise ConfigurationError(f"window_words must be >= 1, got {window_words}")
        self.client = client
        self.prefix = prefix
        self.keys = RemKeys(prefix)
        self.window_words = window_words
        self._fenced_write = scripts.register(client, "rem_fenced_write")

    # -- fencing -----------------------------------------------------------------------------
    def current_fence(self) -> int:
        return read_int(self.client.get(self.keys.fence), self.keys.fence)

    def _apply(self, writes: Sequence[FencedWrite], fence: int, what: str) -> None:
        """Run each write atomically (pipelined when several); LeaseLost on the first refusal.

        Writes before a refused one have landed, each whole: the fence only grows, so they
        landed before the newer fence wrote."""
        writes = [w for w in writes if w]
        if not writes:
            return
        for w in writes:  # each its own token: two writes never leave the same stamp
            w.op("SET", self.keys.write_stamp, self.fresh_stamp())
        if len(writes) == 1:
            replies = [self._fenced_write(keys=writes[0].keys, args=[fence, *writes[0].args])]
        else:
            pipe = self.client.pipeline(transaction=False)
            for w in writes:
                self._fenced_write(keys=w.keys, args=[fence, *w.args], client=pipe)
            replies = pipe.execute()
        for n, reply in enumerate(replies):
            landed = f" ({n} of {len(writes)} parts had landed before)" if n else ""
            self.raise_if_refused(reply, fence, what, landed)

    @staticmethod
    def fresh_stamp() -> str:
        """A write stamp value no write set before (random): equal stamps mean no write
        between the reads, even across a lost or restored key."""
        return uuid.uuid4().hex

    def queue_fence_check(self, pipe: Any, fence: int) -> None:
        """Queue a fence check (and claim) that writes nothing, e.g. into a read transaction;
        pass its reply to :meth:`raise_if_refused`."""
        self._any(fence, "fence check")
        self._fenced_write(keys=[self.keys.fence], args=[fence], client=pipe)

    def raise_if_refused(self, reply: Any, fence: int, what: str, note: str = "") -> None:
        ok, stored = reply
        if int(ok) != 1:
            raise LeaseLost(
                f"REM store {self.prefix!r}: {what} with fence {fence} refused: fence "
                f"{int(stored)} has already written, so this run's heavy lease was taken "
                f"over; nothing more was written{note}. The newer run owns the work")

    @staticmethod
    def _heavy(fence: int, what: str) -> None:
        if isinstance(fence, bool) or not isinstance(fence, int) or fence < 1:
            raise ValueError(f"{what} is a heavy-lane write: pass the lease's fencing number "
                             f"(>= 1), got {fence!r}")

    @staticmethod
    def _any(fence: int, what: str) -> None:
        if isinstance(fence, bool) or not isinstance(fence, int) or fence < 0:
            raise ValueError(f"{what}: fence must be an integer >= 0 (0 = unfenced), "
                             f"got {fence!r}")

    def _writes(self) -> FencedWrite:
        return FencedWrite(self.keys.fence)

    # -- sessions and turns --------------------------------------------------------------------
    def add_session(self, session_id: str, turns: list[str], *, fence: int = 0) -> SessionMeta:
        """Store a new session. Ingest is not a lane, so it may be unfenced (fence 0)."""
        return self.add_sessions({session_id: turns}, fence=fence)[session_id]

    def add_sessions(self, sessions: Mapping[str, Sequence[str]], *,
                     fence: int = 0) -> dict[str, SessionMeta]:
        """Store several new sessions, one atomic write each, in one round trip."""
        self._any(fence, "add_sessions")
        for sid, turns in sessions.items():
            if not isinstance(sid, str) or not sid or sid != sid.strip():
                raise ValueError(f"session id must be a non-empty string without surrounding "
                                 f"whitespace, got {sid!r}")
            if not turns or not all(isinstance(t, str) for t in turns):
                raise ValueError(f"session {sid!r}: turns must be a non-empty list of strings")
        ids = list(sessions)
        if ids:
            exists = self.client.hmget(self.keys.sessions, ids)
            taken = [sid for sid, raw in zip(ids, exists, strict=True) if raw is not None]
            if taken:
                raise ValueError(f"sessions already stored: {taken[:5]}; session ids are "
                                 f"write-once")
        metas: dict[str, SessionMeta] = {}
        batch: list[FencedWrite] = []
        for sid, turns in sessions.items():
            meta = SessionMeta(turns=len(turns), words=sum(word_count(t) for t in turns))
            metas[sid] = meta
            w = self._writes()
            turns_key, minis_key = self.keys.session_keys(sid)
            w.op("DEL", turns_key)
            w.op("DEL", minis_key)
            w.variadic("RPUSH", turns_key, list(turns))
            w.op("HSET", self.keys.sessions, sid,
                 codec.dumps({"turns": meta.turns, "words": meta.words}, STATE_VERSION))
            batch.append(w)
        self._apply(batch, fence, "add_sessions")
        return metas

    def sessions(self) -> dict[str, SessionMeta]:
        """Every session's size, by id (sorted)."""
        raw = self.client.hgetall(self.keys.sessions)
        return {str(sid): decode_meta(value, f"{self.keys.sessions} field {sid!r}")
                for sid, value in sorted(raw.items())}

    def session_meta(self, session_ids: Sequence[str]) -> dict[str, SessionMeta]:
        """Sizes of the given sessions (unknown ids are left out)."""
        if not session_ids:
            return {}
        raw = self.client.hmget(self.keys.sessions, list(session_ids))
        return {sid: decode_meta(value, f"{self.keys.sessions} field {sid!r}")
                for sid, value in zip(session_ids, raw, strict=True) if value is not None}

    def is_over_window(self, meta: SessionMeta) -> bool:
        return meta.words > self.window_words

    def turns(self, session_id: str) -> list[str]:
        return [str(t) for t in self.client.lrange(self.keys.turns(session_id), 0, -1)]

    # -- mini-summaries (backfill) -------------------------------------------------------------
    def minis(self, session_id: str) -> dict[int, str]:
        """Turn index -> mini-summary, in turn order."""
        key = self.keys.minis(session_id)
        raw = self.client.hgetall(key)
        return dict(sorted((read_int(k, f"{key} field {k!r}"), str(v)) for k, v in raw.items()))

    def put_minis(self, minis: Mapping[tuple[str, int], str], *, fence: int) -> None:
        """Write mini-summaries keyed by (session id, turn index), atomically."""
        self._heavy(fence, "put_minis")
        by_session: dict[str, dict[str, str]] = {}
        for (sid, index), text in minis.items():
            by_session.setdefault(sid, {})[str(index)] = text
        w = self._writes()
        for sid, fields in by_session.items():
            w.hset(self.keys.minis(sid), fields)
        self._apply([w], fence, "put_minis")

    def _missing_minis(self) -> dict[str, int]:
        """Over-window session id -> turns lacking a mini-summary (only those lacking some)."""
        metas = {sid: meta for sid, meta in self.sessions().items()
                 if self.is_over_window(meta)}
        over = list(metas)
        if not over:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for sid in over:
            pipe.hlen(self.keys.minis(sid))
        have = pipe.execute()
        missing = {sid: metas[sid].turns - int(n) for sid, n in zip(over, have, strict=True)}
        return {sid: n for sid, n in missing.items() if n > 0}

    def sessions_needing_backfill(self) -> list[str]:
        """Over-window sessions with at least one turn lacking a mini-summary, sorted."""
        return sorted(self._missing_minis())

    def backfill_backlog(self) -> int:
        """Turns still lacking mini-summaries across over-window sessions."""
        return sum(self._missing_minis().values())

    def pending_turns(self, limit: int) -> list[PendingTurn]:
        """Up to ``limit`` turns lacking mini-summaries, by session id then turn index."""
        chosen: list[str] = []
        total = 0
        for sid, n in sorted(self._missing_minis().items()):
            if total >= limit:
                break
            chosen.append(sid)
            total += n
        pipe = self.client.pipeline(transaction=False)
        for sid in chosen:
            pipe.lrange(self.keys.turns(sid), 0, -1)
            pipe.hkeys(self.keys.minis(sid))
        replies = pipe.execute()
        pending: list[PendingTurn] = []
        for n, sid in enumerate(chosen):
            texts, done = replies[2 * n], {str(i) for i in replies[2 * n + 1]}
            for index, text in enumerate(texts):
                if str(index) not in done:
                    pending.append(PendingTurn(sid, index, str(text)))
        return pending[:limit]

    # -- summaries -----------------------------------------------------------------------------
    def summary(self, session_id: str) -> Summary | None:
        return self.summaries([session_id]).get(session_id)

    def summaries(self, session_ids: Sequence[str] | None = None) -> dict[str, Summary]:
        """Summaries by session id (all of them when ``session_ids`` is None)."""
        key = self.keys.summaries
        if session_ids is None:
            pairs = list(self.client.hgetall(key).items())
        elif session_ids:
            values: list[Any] = self.client.hmget(key, list(session_ids))
            pairs = list(zip(session_ids, values, strict=True))
        else:
            pairs = []
        return {str(sid): decode_summary(raw, f"{key} field {sid!r}")
                for sid, raw in sorted(pairs) if raw is not None}

    def put_summaries(self, summaries: Mapping[str, Summary], *, fence: int,
                      undigested: bool = True) -> None:
        """Write session summaries and (by default) queue them for the dream, atomically."""
        self._heavy(fence, "put_summaries")
        if not summaries:
            return
        w = self._writes()
        w.hset(self.keys.summaries, {sid: encode(s) for sid, s in summaries.items()})
        if undigested:
            w.variadic("SADD", self.keys.undigested, list(summaries))
        self._apply([w], fence, "put_summaries")

    def unsummarized(self) -> list[str]:
        """Session ids without a summary, sorted."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hkeys(self.keys.sessions)
        pipe.hkeys(self.keys.summaries)
        sessions, summarized = pipe.execute()
        return sorted(set(sessions) - set(summarized))

    def undigested(self, limit: int | None = None) -> list[str]:
        """Session ids whose summary awaits the dream, sorted (the first ``limit``)."""
        ids = sorted(str(s) for s in self.client.smembers(self.keys.undigested))
        return ids if limit is None else ids[:limit]

    def undigested_count(self) -> int:
        return int(self.client.scard(self.keys.undigested))

    # -- the graph -----------------------------------------------------------------------------
    def graph_version(self) -> int:
        return read_int(self.client.get(self.keys.graph_version), self.keys.graph_version)

    def graph(self) -> Graph:
        """The whole graph from one MULTI/EXEC: nodes, edges and version agree."""
        k = self.keys
        pipe = self.client.pipeline(transaction=True)
        pipe.get(k.graph_version)
        pipe.smembers(k.session_nodes)
        pipe.smembers(k.concept_nodes)
        pipe.hgetall(k.session_edges)
        pipe.hgetall(k.concept_edges)
        version, sessions, concepts, s_edges, c_edges = pipe.execute()
        return Graph(version=read_int(version, k.graph_version),
                     session_nodes=frozenset(sessions), concept_nodes=frozenset(concepts),
                     session_edges=edge_map(s_edges, k.session_edges),
                     concept_edges=edge_map(c_edges, k.concept_edges))

    def session_nodes_among(self, session_ids: Sequence[str]) -> set[str]:
        if not session_ids:
            return set()
        flags = self.client.smismember(self.keys.session_nodes, list(session_ids))
        return {sid for sid, f in zip(session_ids, flags, strict=True) if int(f)}

    def concept_nodes_among(self, concepts: Sequence[str]) -> set[str]:
        if not concepts:
            return set()
        flags = self.client.smismember(self.keys.concept_nodes, list(concepts))
        return {c for c, f in zip(concepts, flags, strict=True) if int(f)}

    def digest(self, delta: GraphDelta, *, fence: int, at: float | None) -> Cycle | None:
        """Add a dream batch to the graph, take its sessions out of the undigested set, bump
        the graph version and (when ``at`` is given) record a dream cycle: one atomic write."""
        self._heavy(fence, "digest")
        k = self.keys
        pipe = self.client.pipeline(transaction=True)
        pipe.scard(k.session_nodes)
        pipe.scard(k.concept_nodes)
        pipe.get(k.graph_version)
        n_sessions, n_concepts, version = pipe.execute()
        new_sessions = len(set(delta.sessions) - self.session_nodes_among(delta.sessions))
        new_concepts = len(set(delta.concepts) - self.concept_nodes_among(delta.concepts))
        cycle = None if at is None else Cycle(
            at=at, digested=len(delta.digested),
            session_nodes=int(n_sessions) + new_sessions,
            concept_nodes=int(n_concepts) + new_concepts,
            graph_version=read_int(version, k.graph_version) + 1)
        w = self._writes()
        w.variadic("SADD", k.session_nodes, list(delta.sessions))
        w.variadic("SADD", k.concept_nodes, list(delta.concepts))
        w.hset(k.session_edges, {f"{s}|{c}": n for (s, c), n in delta.session_edges.items()})
        for (a, b), n in delta.concept_edges.items():
            w.op("HINCRBY", k.concept_edges, f"{a}|{b}", n)
        w.variadic("SREM", k.undigested, list(delta.digested))
        w.op("INCR", k.graph_version)
        if cycle is not None:
            w.op("LPUSH", k.cycles, encode(cycle))
            w.op("LTRIM", k.cycles, 0, RECENT_CYCLES - 1)
        self._apply([w], fence, "digest")
        return cycle

    def recent_cycles(self) -> list[Cycle]:
        """Dream cycles, newest first."""
        return [decode_cycle(raw, self.keys.cycles)
                for raw in self.client.lrange(self.keys.cycles, 0, -1)]

    # -- light-lane records --------------------------------------------------------------------
    def golden_path(self) -> GoldenPath | None:
        raw = self.client.get(self.keys.golden_path)
        return None if raw is None else decode_golden_path(raw, self.keys.golden_path)

    def golden_path_version(self) -> int:
        """The graph version the stored golden path was computed from (0: none yet). Cheaper
        than :meth:`counts` for a due-check: compare with :meth:`graph_version`."""
        path = self.golden_path()
        return 0 if path is None else path.graph_version

    def put_golden_path(self, path: GoldenPath, *, fence: int = 0) -> None:
        self._any(fence, "put_golden_path")
        w = self._writes()
        w.op("SET", self.keys.golden_path, encode(path))
        self._apply([w], fence, "put_golden_path")

    def backfill_backoff_until(self) -> float | None:
        """When the backfill lane's backoff ends (epoch seconds), or None: none recorded."""
        raw = self.client.get(self.keys.backfill_backoff_until)
        return None if raw is None else float(raw)

    def put_backfill_backoff(self, until: float, *, fence: int = 0) -> None:
        """The backfill lane backs off until ``until`` (unfenced by default, as before)."""
        self._any(fence, "put_backfill_backoff")
        w = self._writes()
        w.op("SET", self.keys.backfill_backoff_until, repr(until))
        self._apply([w], fence, "put_backfill_backoff")

    def pulse(self) -> Pulse | None:
        raw = self.client.get(self.keys.pulse)
        return None if raw is None else decode_pulse(raw, self.keys.pulse)

    def put_pulse(self, pulse: Pulse, *, fence: int = 0) -> None:
        self._any(fence, "put_pulse")
        w = self._writes()
        w.op("SET", self.keys.pulse, encode(pulse))
        self._apply([w], fence, "put_pulse")

    # -- what the lanes and the demo watch -----------------------------------------------------
    def counts(self) -> RemCounts:
        k = self.keys
        pipe = self.client.pipeline(transaction=True)
        pipe.hkeys(k.sessions)
        pipe.hkeys(k.summaries)
        pipe.scard(k.undigested)
        pipe.scard(k.session_nodes)
        pipe.scard(k.concept_nodes)
        pipe.hlen(k.session_edges)
        pipe.hlen(k.concept_edges)
        pipe.get(k.graph_version)
        pipe.get(k.golden_path)
        pipe.llen(k.cycles)
        (sessions, summarized, undigested, s_nodes, c_nodes, s_edges, c_edges, version,
         golden, cycles) = pipe.execute()
        golden_version = 0 if golden is None else decode_golden_path(
            golden, k.golden_path).graph_version
        return RemCounts(
            sessions=len(sessions), summaries=len(summarized), undigested=int(undigested),
            session_nodes=int(s_nodes), concept_nodes=int(c_nodes),
            edges=int(s_edges) + int(c_edges), graph_version=read_int(version, k.graph_version),
            golden_path_version=golden_version, backfill_backlog=self.backfill_backlog(),
            unsummarized=len(set(sessions) - set(summarized)), recent_cycles=int(cycles))

    def scan_keys(self) -> list[str]:
        """Every key under this store's REM namespace, sorted."""
        return sorted(str(n) for n in self.client.scan_iter(match=self.keys.pattern,
                                                            count=1000))
