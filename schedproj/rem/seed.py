"""Rebuild the original system's forensic situation (ADR 0022: undigested 371, session nodes
304, 1,354 summaries, dream starved) in a REM store, deterministically.

The text is generated but real: sentences built from a small built-in corpus about maintenance,
memory, graphs, sessions, backups and repository syncs, so the summarizer, the dream and the
golden path have actual words to work on. The graph is built with the dream's own logic.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

from schedproj.rem.store import MemoryStore, RemCounts, Summary
from schedproj.rem.summarizer import ExtractiveSummarizer, Summarizer
from schedproj.rem.text import word_count
from schedproj.rem.work import SUMMARY_SENTENCES, plan_digest

#: The forensic moment's lane history (one earlier run each), by age in weeks: summary just
#: drained, dream and golden-path weeks stale, backup an hour ago. The demo seeds it into
#: Redis; the simulator's forensic scenario starts from it.
SEEDED_HISTORY = {"summary": 0.0, "dream": 3.0, "golden-path": 3.0, "backup": 1 / 168}

#: Nouns by topic; a session mostly talks about one topic, sometimes drifts to another.
TOPICS: dict[str, tuple[str, ...]] = {
    "maintenance": ("lease", "lane", "scheduler", "backlog", "worker", "queue", "cadence",
                    "picker", "starvation", "fairness"),
    "memory": ("memory", "summary", "turn", "context", "window", "recall", "transcript",
               "embedding", "note", "snippet"),
    "graph": ("graph", "node", "edge", "concept", "weight", "path", "cluster", "topology",
              "neighbour", "centroid"),
    "sessions": ("session", "conversation", "agent", "prompt", "reply", "question", "answer",
                 "thread", "user", "dialogue"),
    "backups": ("backup", "snapshot", "restore", "archive", "checksum", "disk", "replica",
                "retention", "copy", "volume"),
    "sync": ("repository", "branch", "commit", "mirror", "tenant", "sync", "merge", "remote",
             "fetch", "release"),
}
VERBS = ("drains", "blocks", "refreshes", "ranks", "digests", "stores", "compacts", "links",
         "updates", "checks", "yields", "reports", "scores", "replays", "indexes")
ADJECTIVES = ("stale", "fresh", "heavy", "light", "nightly", "long", "short", "pending",
              "recent", "durable", "shared", "local")
# Templates use only stop words around the slots, so the concepts come from the corpus.
TEMPLATES = (
    "The {adj} {n1} {verb} the {n2}.",
    "Every {n1} {verb} a {adj} {n2} before the {n3}.",
    "When the {n3} was {adj}, the {n1} {verb} the {n2}.",
    "Why is the {n1} {adj} while the {n2} {verb} the {n3}?",
    "After the {n1} {verb} the {n2}, the {n3} is {adj}.",
    "Then the {n1} {verb} the {adj} {n2} and the {n3}.",
)

#: Ids of the generated sessions, by role; zero-padded so they sort in creation order.
SUMMARIZED_ID, LONG_ID, SHORT_ID = "s-{:05d}", "long-{:03d}", "short-{:04d}"
#: Sessions written per pipelined round trip.
_CHUNK = 200


class _Writer:
    """Deterministic text from one seeded random source."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.topics = sorted(TOPICS)

    def topic_pair(self) -> tuple[str, str]:
        main, other = self.rng.sample(self.topics, 2)
        return main, other

    def sentence(self, topics: tuple[str, str]) -> str:
        def noun() -> str:
            topic = topics[0] if self.rng.random() < 0.75 else topics[1]
            return self.rng.choice(TOPICS[topic])
        return self.rng.choice(TEMPLATES).format(
            adj=self.rng.choice(ADJECTIVES), verb=self.rng.choice(VERBS),
            n1=noun(), n2=noun(), n3=noun())

    def turn(self, topics: tuple[str, str], min_words: int = 0, max_sentences: int = 2) -> str:
        parts = [self.sentence(topics) for _ in range(self.rng.randint(1, max_sentences))]
        while word_count(" ".join(parts)) < min_words:
            parts.append(self.sentence(topics))
        return " ".join(parts)

    def short_session(self, window_words: int) -> list[str]:
        topics = self.topic_pair()
        turns: list[str] = []
        for _ in range(self.rng.randint(3, 6)):
            turn = self.turn(topics)
            if turns and word_count(" ".join([*turns, turn])) > window_words:
                break
            turns.append(turn)
        if word_count(" ".join(turns)) > window_words:
            raise ValueError(f"window_words={window_words} is too small for a short session "
                             f"(one generated turn has {word_count(turns[0])} words)")
        return turns

    def long_session(self, turns: int, window_words: int) -> list[str]:
        topics = self.topic_pair()
        # Every turn gets enough words that the session is over the window whatever the draw.
        min_words = window_words // turns + 1
        return [self.turn(topics, min_words=min_words) for _ in range(turns)]


def seed_forensic(store: MemoryStore, *, summaries: int = 1354, undigested: int = 371,
                  session_nodes: int = 304, long_sessions: int = 24, long_turns: int = 60,
                  short_sessions: int = 150, rng_seed: int = 13,
                  summarizer: Summarizer | None = None, fence: int | None = None) -> RemCounts:
    """Fill an empty REM store with the original's situation and return its counts:

    * ``summaries`` summarized short sessions; of them the first ``session_nodes`` are
      digested into the graph (one dream batch, no cycle record: the original showed
      ``recentCycles: []``), the next ``undigested`` wait in the undigested set, and the rest
      are summarized but neither (the graph lagging the summaries);
    * ``long_sessions`` over-window sessions of ``long_turns`` turns, none backfilled yet;
    * ``short_sessions`` short sessions not summarized yet.

    ``fence`` is used for the heavy-lane writes (default: the store's current fence, at
    least 1, so the first lease grant can write after the seed)."""
    if min(summaries, undigested, session_nodes, long_sessions, short_sessions) < 0:
        raise ValueError("seed_forensic: counts must be >= 0")
    if undigested + session_nodes > summaries:
        raise ValueError(f"seed_forensic: undigested ({undigested}) + session_nodes "
                         f"({session_nodes}) cannot exceed summaries ({summaries})")
    if long_sessions and long_turns < 1:
        raise ValueError("seed_forensic: long_turns must be >= 1")
    if store.client.exists(store.keys.sessions):
        raise ValueError(f"seed_forensic: the REM store {store.prefix!r} already has sessions; "
                         f"seed an empty prefix")
    fence = max(store.current_fence(), 1) if fence is None else fence
    summarizer = summarizer or ExtractiveSummarizer()
    writer = _Writer(random.Random(rng_seed))

    summarized = {SUMMARIZED_ID.format(i): writer.short_session(store.window_words)
                  for i in range(summaries)}
    sessions: dict[str, list[str]] = dict(summarized)
    sessions.update({LONG_ID.format(i): writer.long_session(long_turns, store.window_words)
                     for i in range(long_sessions)})
    sessions.update({SHORT_ID.format(i): writer.short_session(store.window_words)
                     for i in range(short_sessions)})
    _add_in_chunks(store, sessions)

    now = time.time()
    written = {sid: Summary(text=summarizer.summarize(turns, SUMMARY_SENTENCES),
                            created_at=now, from_minis=False)
               for sid, turns in summarized.items()}
    ids = list(summarized)
    digested = ids[:session_nodes]
    waiting = ids[session_nodes:session_nodes + undigested]
    rest = ids[session_nodes + undigested:]
    if digested:
        store.put_summaries({sid: written[sid] for sid in digested}, fence=fence)
        store.digest(plan_digest({sid: written[sid] for sid in digested}, set(), digested),
                     fence=fence, at=None)
    _put_in_chunks(store, written, waiting, fence=fence, undigested=True)
    _put_in_chunks(store, written, rest, fence=fence, undigested=False)
    return store.counts()


def _add_in_chunks(store: MemoryStore, sessions: dict[str, list[str]]) -> None:
    ids = list(sessions)
    for start in range(0, len(ids), _CHUNK):
        store.add_sessions({sid: sessions[sid] for sid in ids[start:start + _CHUNK]})


def _put_in_chunks(store: MemoryStore, written: dict[str, Summary], ids: Sequence[str], *,
                   fence: int, undigested: bool) -> None:
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start:start + _CHUNK]
        store.put_summaries({sid: written[sid] for sid in chunk}, fence=fence,
                            undigested=undigested)


__all__ = ["TOPICS", "seed_forensic"]
