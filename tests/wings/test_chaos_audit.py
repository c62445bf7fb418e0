"""The overlap and loss detector must catch each violation it claims to (pure)."""

from __future__ import annotations

from schedproj.chaos.audit import FencedLedger, audit, runs_from_journal


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
                                "fenced_stragglers": 0, "stale_beat_starts": 0,
                                "recorded_lost": 0, "unended_unrecorded": 0,
                                "late_ends": 0}


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
    assert report.lost == [("h", 4.0, 30.0, 0.0)]
    assert len(runs_from_journal(journal)) == 2  # a's second start is the same run key


def test_a_wait_counts_only_the_time_no_fault_was_disrupting() -> None:
    """Two faults back to back: the lane waited 26 s, of which 18 s inside a fault or its
    recovery (two overlapping spans count once): 8 s of its own wait, within a 10 s bound.
    The same wait with a single short fault is a loss."""
    journal = [start("a", 1, 0), end("a", 1, 1), start("b", 2, 26), end("b", 2, 27)]
    two = [(2.0, 12.0), (10.0, 20.0)]
    assert audit(journal, [], due_bounds_s={"h": 10.0}, window=(0, 27),
                 disruptions=two).lost == []
    one = [(2.0, 6.0)]
    assert audit(journal, [], due_bounds_s={"h": 10.0}, window=(0, 27),
                 disruptions=one).lost == [("h", 0.0, 26.0, 4.0)]


def write(fence: int, t: float) -> dict:
    return {"lane": "h", "fence": fence, "step": 0, "t": t}


def test_an_end_journaled_late_is_not_an_overlap_given_the_ledger() -> None:
    """The short chaos run's failure (times from its dump, less a base): run a stopped at its
    hold cap (last fenced write 56.234), its renewal stuck in Sentinel retries, so its lease
    lapsed, beat recorded it lost and b started (57.377); a's end came only when the renewer
    join timed out, one lease TTL after it stopped (58.235), with no loss noticed."""
    journal = [start("a", 825412, 54.996), {"ev": "lost", "lane": "h", "task": "a",
                                            "fence": 825412, "t": 57.371},
               start("b", 827866, 57.377), end("a", 825412, 58.235), end("b", 827866, 60.586)]
    ledger = [*(write(825412, 55.148 + 0.155 * i) for i in range(8)),
              *(write(827866, 57.529 + 0.151 * i) for i in range(8))]
    report = audit(journal, [], due_bounds_s=BOUNDS, window=(0, 61), ledger=ledger)
    assert report.overlaps == []
    assert [(a.task, b.task) for a, b in report.late_ends] == [("a", "b")]
    # Without the ledger the journaled end is all there is: counted as an overlap.
    assert len(audit(journal, [], due_bounds_s=BOUNDS, window=(0, 61)).overlaps) == 1


def test_a_write_after_the_newer_start_is_an_overlap_given_the_ledger() -> None:
    journal = [start("a", 1, 0), start("b", 2, 3), end("a", 1, 5), end("b", 2, 9)]
    # a's write at 3.5 was accepted (b had not written yet): a ran on after b started.
    ran_on = audit(journal, [], due_bounds_s=BOUNDS, window=(0, 10),
                   ledger=[write(1, 1), write(1, 3.5), write(2, 4)])
    assert len(ran_on.overlaps) == 1 and ran_on.late_ends == []
    # A write at the very start instant counts as after it.
    assert len(audit(journal, [], due_bounds_s=BOUNDS, window=(0, 10),
                     ledger=[write(1, 3), write(2, 4)]).overlaps) == 1
    # A run that wrote nothing (it yielded at its first checkpoint) and ended late: late end.
    silent = audit(journal, [], due_bounds_s=BOUNDS, window=(0, 10), ledger=[write(2, 4)])
    assert silent.overlaps == [] and len(silent.late_ends) == 1
    # A run that noticed its loss stays a fenced straggler, ledger or not.
    noticed = [start("a", 1, 0), start("b", 2, 3), end("a", 1, 5, lost="lost"),
               end("b", 2, 9)]
    report = audit(noticed, [], due_bounds_s=BOUNDS, window=(0, 10), ledger=[write(1, 3.5)])
    assert report.overlaps == [] and len(report.fenced_stragglers) == 1


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
