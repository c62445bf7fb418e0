"""The REM chain's work: what each lane does, with no Celery in it.

Heavy steps (backfill, summarize, dream) work in bounded batches. Before each batch they ask
``should_yield()`` (the hold cap was reached or the lease was lost) and stop there, reporting
the backlog they left, so the picker can re-rank. Each batch is one fenced atomic write: a run
whose lease was taken over gets :class:`~schedproj.core.errors.LeaseLost` instead of writing.

Light steps (golden path, heartbeat) are single cheap passes and write unfenced.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from schedproj.rem.store import (
    GoldenPath,
    Graph,
    GraphDelta,
    MemoryStore,
    Pulse,
    RankedConcept,
    Summary,
    concept_pairs,
)
from schedproj.rem.summarizer import Summarizer
from schedproj.rem.text import bag_of_words, top_terms

#: Sentences in a session summary.
SUMMARY_SENTENCES = 3
#: Concepts taken from each summary: its most frequent content words (ties alphabetical).
CONCEPTS_PER_SUMMARY = 5
#: Golden-path score = STRUCTURAL_WEIGHT * structural + SEMANTIC_WEIGHT * semantic.
STRUCTURAL_WEIGHT = 0.7
SEMANTIC_WEIGHT = 0.3
#: Default batch size of the heavy steps (the original's backfill batch).
DEFAULT_BATCH = 50


@dataclass(frozen=True)
class Progress:
    """What a heavy run did: items done, backlog it left, items it had to skip."""

    done: int
    backlog: int
    skipped: int = 0


def _check_batch(batch: int) -> None:
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")


T = TypeVar("T")


def _chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


# -- memory-summary-backfill ---------------------------------------------------------------------

def backfill(store: MemoryStore, summarizer: Summarizer, *, batch: int = DEFAULT_BATCH,
             fence: int, should_yield: Callable[[], bool]) -> Progress:
    """Write a mini-summary for each turn of every over-window session that lacks one."""
    _check_batch(batch)
    done = 0
    while not should_yield():
        pending = store.pending_turns(batch)
        if not pending:
            break
        minis = {(p.session_id, p.index): summarizer.summarize_turn(p.text) for p in pending}
        store.put_minis(minis, fence=fence)
        done += len(pending)
    return Progress(done=done, backlog=store.backfill_backlog())


# -- summary -------------------------------------------------------------------------------------

def summarize(store: MemoryStore, summarizer: Summarizer, *, batch: int = DEFAULT_BATCH,
              fence: int, should_yield: Callable[[], bool]) -> Progress:
    """Summarize unsummarized sessions and queue them for the dream.

    An over-window session is summarized from its mini-summaries, and skipped (left for a
    later run) while its backfill is unfinished: a summary from a truncated context would be
    wrong, and a hard wait would block the sessions behind it. Sessions are considered once
    per run, so skipped ones do not spin the loop."""
    _check_batch(batch)
    done = skipped = 0
    for chunk in _chunks(store.unsummarized(), batch):
        if should_yield():
            break
        written: dict[str, Summary] = {}
        metas = store.session_meta(chunk)
        for sid in chunk:
            meta = metas.get(sid)
            if meta is None:  # removed meanwhile
                continue
            if store.is_over_window(meta):
                minis = store.minis(sid)
                if len(minis) < meta.turns:
                    skipped += 1
                    continue
                text = summarizer.summarize(list(minis.values()), SUMMARY_SENTENCES)
                written[sid] = Summary(text=text, created_at=time.time(), from_minis=True)
            else:
                text = summarizer.summarize(store.turns(sid), SUMMARY_SENTENCES)
                written[sid] = Summary(text=text, created_at=time.time(), from_minis=False)
        store.put_summaries(written, fence=fence)
        done += len(written)
    return Progress(done=done, backlog=len(store.unsummarized()), skipped=skipped)


# -- dream ---------------------------------------------------------------------------------------

def concepts_of(text: str) -> list[tuple[str, int]]:
    """A summary's concepts with their term frequency: its top content words."""
    return top_terms(text, CONCEPTS_PER_SUMMARY)


def plan_digest(summaries: Mapping[str, Summary], already: set[str],
                digested: Sequence[str]) -> GraphDelta:
    """The graph additions for a batch (pure). ``already`` are sessions that are nodes
    already: they are only taken out of the undigested set, never counted twice."""
    sessions: list[str] = []
    concepts: set[str] = set()
    session_edges: dict[tuple[str, str], int] = {}
    concept_edges: Counter[tuple[str, str]] = Counter()
    for sid in sorted(summaries):
        if sid in already:
            continue
        terms = concepts_of(summaries[sid].text)
        sessions.append(sid)
        concepts.update(c for c, _ in terms)
        for concept, tf in terms:
            session_edges[(sid, concept)] = tf
        concept_edges.update(concept_pairs(c for c, _ in terms))
    return GraphDelta(sessions=tuple(sessions), concepts=tuple(sorted(concepts)),
                      session_edges=session_edges, concept_edges=dict(sorted(
                          concept_edges.items())), digested=tuple(digested))


def dream(store: MemoryStore, *, batch: int = DEFAULT_BATCH, fence: int,
          should_yield: Callable[[], bool]) -> Progress:
    """Digest undigested summaries into the graph, one batch (one dream cycle) at a time.

    An undigested session without a readable summary is dropped from the set and counted in
    ``skipped``: there is nothing to digest, and keeping it would keep the lane due forever."""
    _check_batch(batch)
    done = skipped = 0
    while not should_yield():
        ids = store.undigested(batch)
        if not ids:
            break
        summaries = store.summaries(ids)
        delta = plan_digest(summaries, store.session_nodes_among(ids), ids)
        store.digest(delta, fence=fence, at=time.time())
        done += len(summaries)
        skipped += len(ids) - len(summaries)
    return Progress(done=done, backlog=store.undigested_count(), skipped=skipped)


# -- golden-path ---------------------------------------------------------------------------------

def rank_concepts(graph: Graph, summaries: Mapping[str, Summary]) -> list[RankedConcept]:
    """Score every concept node (pure). The formula:

    * structural = (sum of the weights of the concept's edges, session and concept ones)
      divided by the largest such sum in the graph, in [0, 1];
    * semantic = 1 - cosine(concept vector, centroid), in [0, 1], where the concept vector is
      the summed bag of content words of the sessions linked to the concept and the centroid
      is the summed bag of words of every session node: how far the concept's neighbourhood
      sits from what the graph talks about overall;
    * score = STRUCTURAL_WEIGHT * structural + SEMANTIC_WEIGHT * semantic.

    Ranked by score (rounded to 12 places so float noise never decides), then concept name.
    """
    bags = {sid: bag_of_words(summaries[sid].text) for sid in sorted(graph.session_nodes)
            if sid in summaries}
    centroid: Counter[str] = Counter()
    for bag in bags.values():
        centroid.update(bag)
    weight: Counter[str] = Counter()
    neighbours: dict[str, list[str]] = {}
    for (sid, concept), w in sorted(graph.session_edges.items()):
        weight[concept] += w
        neighbours.setdefault(concept, []).append(sid)
    for (a, b), w in sorted(graph.concept_edges.items()):
        weight[a] += w
        weight[b] += w
    heaviest = max(weight.values(), default=0) or 1
    ranked: list[RankedConcept] = []
    for concept in sorted(graph.concept_nodes):
        vector: Counter[str] = Counter()
        for sid in neighbours.get(concept, []):
            vector.update(bags.get(sid, Counter()))
        structural = weight[concept] / heaviest
        semantic = 1.0 - _cosine(vector, centroid)
        score = STRUCTURAL_WEIGHT * structural + SEMANTIC_WEIGHT * semantic
        ranked.append(RankedConcept(concept=concept, score=round(score, 12),
                                    structural=round(structural, 12),
                                    semantic=round(semantic, 12)))
    ranked.sort(key=lambda r: (-r.score, r.concept))
    return ranked


def _cosine(a: Counter[str], b: Counter[str]) -> float:
    dot = sum(n * b[w] for w, n in a.items() if w in b)
    norm = math.sqrt(sum(n * n for n in a.values())) * math.sqrt(sum(n * n for n in b.values()))
    # Clamp: rounding can push a cosine of identical vectors a hair over 1.
    return min(1.0, max(0.0, dot / norm)) if norm else 0.0


def golden_path(store: MemoryStore, *, top: int = 10) -> tuple[RankedConcept, ...]:
    """Score the graph and write the top ``top`` concepts with the graph version they came
    from. Cheap: pure arithmetic over the graph, no model call."""
    if top < 1:
        raise ValueError(f"top must be >= 1, got {top}")
    graph = store.graph()
    summaries = store.summaries(sorted(graph.session_nodes))
    ranking = tuple(rank_concepts(graph, summaries)[:top])
    store.put_golden_path(GoldenPath(graph_version=graph.version, computed_at=time.time(),
                                     ranking=ranking))
    return ranking


# -- swarm-heartbeat -----------------------------------------------------------------------------

def heartbeat(store: MemoryStore, *, host: str, pid: int) -> Pulse:
    """Write the liveness pulse."""
    pulse = Pulse(host=host, pid=pid, at=time.time())
    store.put_pulse(pulse)
    return pulse


__all__ = [
    "CONCEPTS_PER_SUMMARY",
    "DEFAULT_BATCH",
    "SEMANTIC_WEIGHT",
    "STRUCTURAL_WEIGHT",
    "SUMMARY_SENTENCES",
    "Progress",
    "backfill",
    "concepts_of",
    "dream",
    "golden_path",
    "heartbeat",
    "plan_digest",
    "rank_concepts",
    "summarize",
]
