"""The overlap and loss detector must catch each violation it claims to (pure)."""

from __future__ import annotations

from schedproj.audit import FencedLedger, audit, runs_from_journal


def start(task: str, fence: int, t: float, lane: str = "h") -> dict:
    return {"ev": "start", "lane": lane, "task": task, "fence": fence, "t": t}


def end(task: str, fence: int, t: float, lost: str | None = None, lane: str = "h") -> dict:
    return {"ev": "end", "lane": lane, "task": task, "fence": fence, "t": t,
            "outcome": "completed", "lost": lost}


BOUNDS = {"h": 100.0}


def test_clean_history_has_no_findings() -> None:
    journal = [start("a", 1, 0), end("a", 1, 5), start("b", 2, 6), end("b", 2, 9)]
    report = audit(journal, [{"task": "a"}, {"task": "b"}], due_bounds_s=BOUNDS,
                   window=(0, 10))
    assert report.summary() == {"heavy_runs": 2, "light_runs": 0, "overlaps": 0,
                                "duplicates": 0, "stale_starts": 0, "lost_runs": 0,
                                "fenced_stragglers": 0}


def test_overlap_and_fenced_straggler_are_told_apart() -> None:
    unnoticed = [start("a", 1, 0), start("b", 2, 3), end("a", 1, 5), end("b", 2, 9)]
    assert len(audit(unnoticed, [], due_bounds_s=BOUNDS, window=(0, 10)).overlaps) == 1
    noticed = [start("a", 1, 0), start("b", 2, 3), end("a", 1, 5, lost="lost"),
               end("b", 2, 9)]
    report = audit(noticed, [], due_bounds_s=BOUNDS, window=(0, 10))
    assert report.overlaps == [] and len(report.fenced_stragglers) == 1


def test_duplicates_stale_starts_and_lost_runs() -> None:
    journal = [start("a", 5, 0), end("a", 5, 1), start("a", 5, 2), end("a", 5, 3),
               start("c", 3, 4), end("c", 3, 5)]
    report = audit(journal, [{"task": "x"}, {"task": "x"}], due_bounds_s={"h": 10.0},
                   window=(0, 30))
    assert report.duplicates == ["a", "x"]  # a executed twice, x sent twice
    assert [r.task for r in report.stale_starts] == ["c"]
    assert report.lost == [("h", 4.0, 30.0)]
    assert len(runs_from_journal(journal)) == 2  # a's second start is the same run key


def test_killed_run_without_end_is_not_an_overlap() -> None:
    journal = [start("a", 1, 0), start("b", 2, 30), end("b", 2, 31)]
    assert audit(journal, [], due_bounds_s=BOUNDS, window=(0, 40)).overlaps == []


def test_fenced_ledger_refuses_late_writers(redis_client, key_prefix) -> None:
    ledger = FencedLedger(redis_client, key_prefix)
    assert ledger.append(5, {"fence": 5, "step": 1})
    assert ledger.append(7, {"fence": 7, "step": 1})
    assert not ledger.append(5, {"fence": 5, "step": 2})  # the paused holder wakes up late
    assert ledger.refused() == 1 and ledger.monotone()
    assert [e["fence"] for e in ledger.entries()] == [5, 7]
