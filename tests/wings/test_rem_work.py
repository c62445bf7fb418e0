"""The REM chain's work against a real Redis: backfill, summarize, dream, golden path and
heartbeat, each in bounded batches that yield when asked and report the backlog they left.

Every test uses its own key prefix in Redis DB 14 (see ``conftest.py``); no summarizer latency.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
import redis

from schedproj.rem import work
from schedproj.rem.store import MemoryStore, concept_pairs
from schedproj.rem.summarizer import ExtractiveSummarizer
from schedproj.rem.text import sentences

pytestmark = pytest.mark.timeout(60)

WINDOW = 50
FENCE = 1


def never() -> bool:
    return False


def yield_after(batches: int) -> Callable[[], bool]:
    """should_yield that allows ``batches`` batches, then asks to stop."""
    calls = {"n": 0}

    def should_yield() -> bool:
        calls["n"] += 1
        return calls["n"] > batches
    return should_yield


def long_turns(topic: str, n: int) -> list[str]:
    # Two sentences per turn, 12+ words each turn: n >= 5 turns is over a 50-word window.
    return [f"The {topic} worker drains backlog item {i} quickly. "
            f"Then {topic} lease number {i} renews before the deadline." for i in range(n)]


def short_turns(topic: str) -> list[str]:
    return [f"The {topic} graph links a node.", f"Every {topic} node keeps an edge."]


@pytest.fixture
def store(redis_client: redis.Redis, key_prefix: str) -> MemoryStore:
    return MemoryStore(redis_client, key_prefix, window_words=WINDOW)


@pytest.fixture
def summarizer() -> ExtractiveSummarizer:
    return ExtractiveSummarizer()


def test_backfill_writes_a_mini_for_each_turn_of_over_window_sessions_only(
        store: MemoryStore, summarizer: ExtractiveSummarizer) -> None:
    store.add_session("long", long_turns("alpha", 6))
    store.add_session("short", short_turns("beta"))
    assert store.sessions_needing_backfill() == ["long"]
    assert store.backfill_backlog() == 6

    progress = work.backfill(store, summarizer, batch=4, fence=FENCE, should_yield=never)

    assert progress == work.Progress(done=6, backlog=0)
    minis = store.minis("long")
    assert sorted(minis) == list(range(6))
    for index, turn in enumerate(store.turns("long")):
        # The mini is one sentence taken from that turn's own text.
        assert minis[index] in sentences(turn)
        assert minis[index] == summarizer.summarize_turn(turn)
    assert store.minis("short") == {}
    assert store.sessions_needing_backfill() == []


def test_backfill_yields_between_batches_and_reports_backlog(
        store: MemoryStore, summarizer: ExtractiveSummarizer) -> None:
    store.add_session("a", long_turns("alpha", 7))
    store.add_session("b", long_turns("gamma", 7))

    first = work.backfill(store, summarizer, batch=5, fence=FENCE, should_yield=yield_after(2))
    assert first == work.Progress(done=10, backlog=4)
    assert store.backfill_backlog() == 4

    stopped = work.backfill(store, summarizer, batch=5, fence=FENCE, should_yield=lambda: True)
    assert stopped == work.Progress(done=0, backlog=4)

    rest = work.backfill(store, summarizer, batch=5, fence=FENCE, should_yield=never)
    assert rest == work.Progress(done=4, backlog=0)


def test_summarize_uses_minis_and_skips_a_session_whose_backfill_is_unfinished(
        store: MemoryStore, summarizer: ExtractiveSummarizer) -> None:
    store.add_session("a-long", long_turns("alpha", 6))
    store.add_session("b-long", long_turns("gamma", 6))
    store.add_session("c-short", short_turns("delta"))
    # Backfill exactly a-long (pending turns come by session id, then turn index).
    work.backfill(store, summarizer, batch=6, fence=FENCE, should_yield=yield_after(1))
    assert store.sessions_needing_backfill() == ["b-long"]

    progress = work.summarize(store, summarizer, batch=2, fence=FENCE, should_yield=never)

    assert progress == work.Progress(done=2, backlog=1, skipped=1)
    a = store.summary("a-long")
    assert a is not None and a.from_minis
    minis = set(store.minis("a-long").values())
    assert sentences(a.text) and set(sentences(a.text)) <= minis
    c = store.summary("c-short")
    assert c is not None and not c.from_minis
    assert set(sentences(c.text)) <= {s for t in store.turns("c-short") for s in sentences(t)}
    assert store.summary("b-long") is None
    assert store.unsummarized() == ["b-long"]
    assert store.undigested() == ["a-long", "c-short"]

    work.backfill(store, summarizer, fence=FENCE, should_yield=never)
    again = work.summarize(store, summarizer, fence=FENCE, should_yield=never)

    assert again == work.Progress(done=1, backlog=0, skipped=0)
    b = store.summary("b-long")
    assert b is not None and b.from_minis
    assert set(sentences(b.text)) <= set(store.minis("b-long").values())
    assert store.undigested() == ["a-long", "b-long", "c-short"]


def test_summarize_yields_between_batches(store: MemoryStore,
                                          summarizer: ExtractiveSummarizer) -> None:
    for i in range(5):
        store.add_session(f"s{i}", short_turns(f"topic{i}"))
    progress = work.summarize(store, summarizer, batch=2, fence=FENCE,
                              should_yield=yield_after(1))
    assert progress == work.Progress(done=2, backlog=3)
    assert store.unsummarized() == ["s2", "s3", "s4"]


def _summarized_sessions(store: MemoryStore, summarizer: ExtractiveSummarizer,
                         topics: list[str]) -> None:
    for i, topic in enumerate(topics):
        store.add_session(f"s{i:02d}", [
            f"The {topic} scheduler drains the {topic} backlog nightly.",
            f"Every {topic} backlog item needs a {topic} summary and a graph node.",
            f"Graph edges link the {topic} summary to memory."])
    work.summarize(store, summarizer, fence=FENCE, should_yield=never)


def test_dream_digests_in_batches_and_the_graph_matches_the_summaries(
        store: MemoryStore, summarizer: ExtractiveSummarizer) -> None:
    _summarized_sessions(store, summarizer, ["alpha", "beta", "gamma", "delta", "epsilon",
                                             "zeta", "eta"])
    summaries = store.summaries()
    assert store.undigested_count() == 7

    first = work.dream(store, batch=3, fence=FENCE, should_yield=yield_after(2))
    assert first == work.Progress(done=6, backlog=1)
    assert store.undigested_count() == 1
    assert len(store.recent_cycles()) == 2

    rest = work.dream(store, batch=3, fence=FENCE, should_yield=never)
    assert rest == work.Progress(done=1, backlog=0)
    assert store.undigested_count() == 0

    # The graph is exactly what the digested summaries say.
    concepts = {sid: work.concepts_of(s.text) for sid, s in summaries.items()}
    pairs: Counter[tuple[str, str]] = Counter()
    for terms in concepts.values():
        pairs.update(concept_pairs(c for c, _ in terms))
    graph = store.graph()
    assert graph.session_nodes == set(summaries)
    assert graph.concept_nodes == {c for terms in concepts.values() for c, _ in terms}
    assert graph.session_edges == {(sid, c): tf for sid, terms in concepts.items()
                                   for c, tf in terms}
    assert graph.concept_edges == dict(pairs)
    assert graph.version == 3  # one bump per batch

    counts = store.counts()
    assert counts.session_nodes == 7
    assert counts.concept_nodes == len(graph.concept_nodes)
    assert counts.edges == len(graph.session_edges) + len(graph.concept_edges)
    newest = store.recent_cycles()[0]
    assert (newest.digested, newest.session_nodes, newest.concept_nodes,
            newest.graph_version) == (1, 7, len(graph.concept_nodes), 3)


def test_dream_keeps_only_the_recent_cycles(store: MemoryStore,
                                            summarizer: ExtractiveSummarizer) -> None:
    _summarized_sessions(store, summarizer, [f"t{i}x" for i in range(22)])
    progress = work.dream(store, batch=1, fence=FENCE, should_yield=never)
    assert progress.done == 22
    cycles = store.recent_cycles()
    assert len(cycles) == 20
    assert [c.graph_version for c in cycles] == list(range(22, 2, -1))  # newest first


def test_golden_path_ranks_the_graph_and_changes_when_it_does(
        store: MemoryStore, summarizer: ExtractiveSummarizer) -> None:
    _summarized_sessions(store, summarizer, ["alpha", "beta", "gamma"])
    work.dream(store, fence=FENCE, should_yield=never)

    first = work.golden_path(store, top=5)
    assert 0 < len(first) <= 5
    assert [r.score for r in first] == sorted((r.score for r in first), reverse=True)
    assert work.golden_path(store, top=5) == first  # deterministic on an unchanged graph
    stored = store.golden_path()
    assert stored is not None and stored.ranking == first
    assert (stored.graph_version == store.graph_version() == store.golden_path_version()
            == store.counts().golden_path_version)

    for i in range(4):
        store.add_session(f"q{i}", [f"Quasar telescopes observe quasar jets {i}.",
                                    "Quasar light reaches the telescopes late."])
    work.summarize(store, summarizer, fence=FENCE, should_yield=never)
    work.dream(store, fence=FENCE, should_yield=never)

    second = work.golden_path(store, top=5)
    assert second != first
    assert "quasar" in {r.concept for r in second}
    stored = store.golden_path()
    assert stored is not None and stored.graph_version == store.graph_version() > 1


def test_heartbeat_writes_the_pulse(store: MemoryStore) -> None:
    pulse = work.heartbeat(store, host="h1", pid=42)
    assert store.pulse() == pulse
    assert (pulse.host, pulse.pid) == ("h1", 42)


def test_heavy_work_needs_a_fence(store: MemoryStore,
                                  summarizer: ExtractiveSummarizer) -> None:
    store.add_session("long", long_turns("alpha", 6))
    with pytest.raises(ValueError, match="fencing number"):
        work.backfill(store, summarizer, fence=0, should_yield=never)
    assert store.minis("long") == {}
