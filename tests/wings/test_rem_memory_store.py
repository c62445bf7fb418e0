"""The REM memory store against a real Redis: fencing, queries and counts, backups (atomic
file, point-in-time read, restore to an equal store, pruning), the summarizer and its
loader, and the forensic seed.

Every test uses its own key prefix in Redis DB 14 (see ``conftest.py``).
"""

from __future__ import annotations

import json
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest
import redis

from schedproj.core.errors import ConfigurationError, LeaseLost, StateError
from schedproj.rem import backup, work
from schedproj.rem.seed import seed_forensic
from schedproj.rem.store import GoldenPath, MemoryStore, Pulse, RemKeys, Summary
from schedproj.rem.summarizer import SETTING, ExtractiveSummarizer, load_summarizer
from schedproj.rem.text import sentences
from schedproj.store.protocol import Keys

pytestmark = pytest.mark.timeout(60)

WINDOW = 50


def never() -> bool:
    return False


def long_turns(n: int) -> list[str]:
    return [f"The worker drains backlog item {i} quickly. Then lease {i} renews in time."
            for i in range(n)]


@pytest.fixture
def store(redis_client: redis.Redis, key_prefix: str) -> MemoryStore:
    # The REM store alone under this prefix: no scheduler epoch beside it.
    redis_client.delete(Keys(key_prefix).epoch)
    return MemoryStore(redis_client, key_prefix, window_words=WINDOW)


def contents(store: MemoryStore) -> dict[str, Any]:
    """Every REM key and value, by name relative to the prefix."""
    return backup.read_all(store)


# -- keys, queries, counts ---------------------------------------------------------------------

def test_every_key_lives_under_the_rem_namespace(store: MemoryStore) -> None:
    store.add_session("s1", long_turns(6))
    store.put_minis({("s1", 0): "a mini."}, fence=1)
    store.put_summaries({"s1": Summary("x.", 1.0, False)}, fence=1)
    store.put_pulse(Pulse("h", 1, 2.0))
    keys = RemKeys(store.prefix)
    names = [str(n) for n in store.client.keys(f"{store.prefix}:*")]
    assert names and all(n.startswith(f"{store.prefix}:rem:") for n in names)
    assert all(keys.redis_type(n) is not None for n in names)


def test_queries_and_counts(store: MemoryStore) -> None:
    store.add_session("long-a", long_turns(6))
    store.add_session("long-b", long_turns(6))
    store.add_session("short", ["A short turn."])
    store.put_minis({("long-a", i): f"mini {i}." for i in range(6)}, fence=1)
    store.put_minis({("long-b", 0): "mini."}, fence=1)
    store.put_summaries({"short": Summary("A short turn.", 1.0, False)}, fence=1)

    assert store.sessions_needing_backfill() == ["long-b"]
    assert store.backfill_backlog() == 5
    assert [(p.session_id, p.index) for p in store.pending_turns(3)] == [
        ("long-b", 1), ("long-b", 2), ("long-b", 3)]
    assert store.unsummarized() == ["long-a", "long-b"]
    assert store.undigested_count() == 1
    assert store.counts().as_dict() == {
        "sessions": 3, "summaries": 1, "undigested": 1, "session_nodes": 0,
        "concept_nodes": 0, "edges": 0, "graph_version": 0, "golden_path_version": 0,
        "backfill_backlog": 5, "unsummarized": 2, "recent_cycles": 0}
    with pytest.raises(ValueError, match="write-once"):
        store.add_session("short", ["again."])


def test_garbage_in_a_key_is_a_state_error_naming_it(store: MemoryStore) -> None:
    store.client.hset(store.keys.summaries, "s1", "{not json")
    with pytest.raises(StateError, match="summaries"):
        store.summaries()


def test_client_must_decode_responses(key_prefix: str, redis_url: str) -> None:
    raw = redis.Redis.from_url(redis_url)
    try:
        with pytest.raises(ConfigurationError, match="decode"):
            MemoryStore(raw, key_prefix)
    finally:
        raw.close()


# -- fencing -----------------------------------------------------------------------------------

def test_an_older_fence_is_refused_after_a_newer_one_wrote_and_changes_nothing(
        store: MemoryStore) -> None:
    store.add_session("s1", long_turns(6))
    store.put_minis({("s1", 0): "old run's mini."}, fence=3)
    store.put_minis({("s1", 1): "new run's mini."}, fence=5)
    before = contents(store)

    with pytest.raises(LeaseLost, match="fence 3 refused: fence 5"):
        store.put_minis({("s1", 2): "late write."}, fence=3)
    with pytest.raises(LeaseLost):
        store.put_summaries({"s1": Summary("late.", 1.0, True)}, fence=4)
    with pytest.raises(LeaseLost):
        store.digest(work.plan_digest({"s1": Summary("late.", 1.0, True)}, set(), ["s1"]),
                     fence=2, at=1.0)

    assert contents(store) == before
    assert store.current_fence() == 5
    store.put_minis({("s1", 2): "same fence writes on."}, fence=5)
    assert store.minis("s1")[2] == "same fence writes on."


def test_interleaved_runs_the_late_zombie_cannot_land(store: MemoryStore) -> None:
    store.add_session("s1", long_turns(6))
    zombie_batch = store.pending_turns(3)  # read under fence 1, then the lease moves on
    store.put_minis({("s1", 0): "successor."}, fence=2)
    with pytest.raises(LeaseLost):
        store.put_minis({(p.session_id, p.index): "zombie." for p in zombie_batch}, fence=1)
    assert store.minis("s1") == {0: "successor."}


def test_fence_zero_is_only_for_light_writes(store: MemoryStore) -> None:
    store.put_minis({("s1", 0): "x."}, fence=9)
    with pytest.raises(ValueError, match="heavy-lane write"):
        store.put_minis({("s1", 1): "x."}, fence=0)
    with pytest.raises(ValueError, match="heavy-lane write"):
        store.put_summaries({"s1": Summary("x.", 1.0, False)}, fence=0)
    # Light-lane writes and ingest are unfenced and never bump the fence.
    store.put_golden_path(GoldenPath(graph_version=0, computed_at=1.0, ranking=()))
    store.put_pulse(Pulse("h", 1, 1.0))
    store.add_session("s2", ["A turn."])
    assert store.current_fence() == 9


# -- backup ------------------------------------------------------------------------------------

def _populated(store: MemoryStore) -> None:
    seed_forensic(store, summaries=40, undigested=12, session_nodes=15, long_sessions=2,
                  long_turns=8, short_sessions=5)
    summarizer = ExtractiveSummarizer()
    work.backfill(store, summarizer, batch=5, fence=2, should_yield=lambda: True)
    work.backfill(store, summarizer, batch=5, fence=2, should_yield=iter([False, True]).__next__)
    work.dream(store, batch=5, fence=2, should_yield=never)
    work.golden_path(store, top=5)
    work.heartbeat(store, host="h", pid=7)


def test_snapshot_restores_to_an_equal_store(store: MemoryStore, tmp_path: Path) -> None:
    _populated(store)
    store.client.set(f"{store.keys.base}:lane-bookkeeping", "kept too")
    path = backup.snapshot(store, tmp_path, fence=2)
    assert path.parent == tmp_path and path.name.startswith("backup-")
    doc = json.loads(path.read_text())
    assert doc["version"] == 1 and doc["prefix"] == store.prefix

    copy = MemoryStore(store.client, f"{store.prefix}:copy", window_words=WINDOW)
    copy.add_session("stale", ["Replaced by the restore."])
    assert backup.restore(copy, path) == len(doc["keys"])

    assert copy.counts() == store.counts()
    assert contents(copy) == contents(store)
    assert copy.graph() == store.graph()
    assert copy.summaries() == store.summaries()
    assert copy.turns("long-000") == store.turns("long-000")


# -- the write stamp (beat's REM due checks are called again when it moves) -------------------

def test_every_write_sets_a_stamp_no_write_set_before(store: MemoryStore) -> None:
    """Each write through the store sets the stamp in its own atomic step, to a value never
    held before; a refused write leaves it alone. The REM due checks read nothing else."""
    def stamp() -> str | None:
        return store.client.get(store.keys.write_stamp)

    seen: list[str | None] = [stamp()]
    writes = [
        lambda: store.add_sessions({"s1": long_turns(6), "s2": ["A short turn."]}),
        lambda: store.put_minis({("s1", 0): "a mini."}, fence=1),
        lambda: store.put_summaries({"s2": Summary("x.", 1.0, False)}, fence=1),
        lambda: work.dream(store, batch=5, fence=1, should_yield=never),
        lambda: work.golden_path(store, top=5),
        lambda: store.put_pulse(Pulse("h", 1, 2.0)),
        lambda: store.put_backfill_backoff(time.time() + 60),
    ]
    for write in writes:
        write()
        seen.append(stamp())
    assert None not in seen[1:] and len(set(seen)) == len(seen), seen
    store.put_minis({("s1", 1): "newer."}, fence=5)
    moved = stamp()
    with pytest.raises(LeaseLost):
        store.put_minis({("s1", 2): "fenced out."}, fence=3)
    assert stamp() == moved
    assert store.backfill_backoff_until() is not None


def test_a_restore_sets_a_fresh_stamp_and_a_snapshot_leaves_it_out(
        store: MemoryStore, tmp_path: Path) -> None:
    _populated(store)
    before = store.client.get(store.keys.write_stamp)
    path = backup.snapshot(store, tmp_path, fence=2)
    assert "rem:write-stamp" not in json.loads(path.read_text())["keys"]
    backup.restore(store, path)
    after = store.client.get(store.keys.write_stamp)
    assert after is not None and after != before


def test_snapshot_file_appears_atomically(store: MemoryStore, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _populated(store)
    good = backup.snapshot(store, tmp_path, fence=2)
    good_text = good.read_text()

    def broken_dump(*args: Any, **kwargs: Any) -> None:
        args[1].write('{"version": 1, "keys": {"half')  # a partial write, then a crash
        raise OSError("disk full")

    monkeypatch.setattr(json, "dump", broken_dump)
    with pytest.raises(OSError, match="disk full"):
        backup.snapshot(store, tmp_path, fence=2)
    monkeypatch.undo()

    assert sorted(p.name for p in tmp_path.iterdir()) == [good.name]  # no temp file left
    assert good.read_text() == good_text


def test_old_snapshots_are_pruned(store: MemoryStore, tmp_path: Path) -> None:
    store.add_session("s1", ["One turn."])
    made = []
    for _ in range(9):
        made.append(backup.snapshot(store, tmp_path, fence=0, keep=7))
        time.sleep(0.002)  # distinct timestamps in the names
    assert backup.backups(tmp_path) == made[-7:]


def test_a_fenced_out_backup_writes_no_file(store: MemoryStore, tmp_path: Path) -> None:
    store.put_minis({("s1", 0): "x."}, fence=4)
    with pytest.raises(LeaseLost):
        backup.snapshot(store, tmp_path, fence=3)
    assert backup.backups(tmp_path) == []


def test_restore_refuses_an_unknown_version(store: MemoryStore, tmp_path: Path) -> None:
    path = tmp_path / "backup-x.json"
    path.write_text(json.dumps({"version": 99, "prefix": "p", "keys": {}}))
    with pytest.raises(StateError, match="version 99"):
        backup.restore(store, path)
    path.write_text("{half")
    with pytest.raises(StateError, match="JSON"):
        backup.restore(store, path)


# -- summarizer --------------------------------------------------------------------------------

TEXT = ("The dream digests summaries into the graph. Cats sleep. "
        "The graph grows when the dream digests new summaries. Rain falls on the roof. "
        "Golden path scoring reads the graph after the dream.")


def test_extractive_summarizer_is_deterministic_and_extractive() -> None:
    s = ExtractiveSummarizer()
    summary = s.summarize([TEXT], 2)
    assert summary == ExtractiveSummarizer().summarize([TEXT], 2)
    picked = sentences(summary)
    assert len(picked) == 2 and set(picked) <= set(sentences(TEXT))
    # The frequent-topic sentences win, and keep their original order.
    assert picked == ["The dream digests summaries into the graph.",
                      "The graph grows when the dream digests new summaries."]
    turn = s.summarize_turn("Short one. The dream digests the graph of dream summaries.")
    assert turn == "The dream digests the graph of dream summaries."
    assert s.summarize(["Only one sentence here."], 3) == "Only one sentence here."


class Upper:
    def __init__(self, latency_s: float = 0.0) -> None:
        self.latency_s = latency_s

    def summarize_turn(self, text: str) -> str:
        return text.upper()

    def summarize(self, texts: list[str], max_sentences: int) -> str:
        return " ".join(texts).upper()


def test_load_summarizer(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(load_summarizer(None, 0.0), ExtractiveSummarizer)
    assert isinstance(load_summarizer("extractive", 0.0), ExtractiveSummarizer)
    module = types.ModuleType("fake_rem_models")
    module.Upper = Upper  # type: ignore[attr-defined]
    module.not_a_summarizer = lambda: object()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_rem_models", module)

    loaded = load_summarizer("fake_rem_models:Upper", 0.25)
    assert isinstance(loaded, Upper) and loaded.latency_s == 0.25
    assert loaded.summarize_turn("a.") == "A."

    for spec, why in [("no_such_module_xyz:Thing", "cannot import"),
                      ("fake_rem_models:Missing", "no attribute"),
                      ("fake_rem_models:not_a_summarizer", "without the method"),
                      ("just-a-name", "not 'package.module:attr'")]:
        with pytest.raises(ConfigurationError, match=SETTING) as err:
            load_summarizer(spec, 0.0)
        assert why in str(err.value)
    assert SETTING == "SCHEDPROJ_REM_SUMMARIZER"


# -- seed --------------------------------------------------------------------------------------

def test_seed_forensic_builds_the_originals_situation_quickly(store: MemoryStore,
                                                              redis_client: redis.Redis,
                                                              key_prefix: str) -> None:
    store = MemoryStore(redis_client, key_prefix)  # the default 1000-word window
    started = time.monotonic()
    counts = seed_forensic(store)
    elapsed = time.monotonic() - started

    assert elapsed < 5.0
    assert (counts.summaries, counts.undigested, counts.session_nodes) == (1354, 371, 304)
    assert counts.sessions == 1354 + 24 + 150
    assert counts.unsummarized == 24 + 150
    assert counts.backfill_backlog == 24 * 60
    assert len(store.sessions_needing_backfill()) == 24
    assert counts.recent_cycles == 0 and counts.graph_version == 1
    assert counts.concept_nodes > 0 and counts.edges > 0
    assert counts == store.counts()
    with pytest.raises(ValueError, match="already has sessions"):
        seed_forensic(store)


def test_seed_is_deterministic(redis_client: redis.Redis, key_prefix: str) -> None:
    a = MemoryStore(redis_client, f"{key_prefix}:a")
    b = MemoryStore(redis_client, f"{key_prefix}:b")
    for s in (a, b):
        seed_forensic(s, summaries=30, undigested=10, session_nodes=12, long_sessions=2,
                      short_sessions=3)
    assert a.sessions() == b.sessions()
    assert a.turns("long-001") == b.turns("long-001")
    assert a.graph() == b.graph()
    assert ({k: v.text for k, v in a.summaries().items()}
            == {k: v.text for k, v in b.summaries().items()})
