"""The overlap and loss detector must catch each violation it claims to (pure)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import redis

from schedproj.chaos.audit import (
    ENTRY_INTERVALS,
    ENTRY_MINUTELY,
    FencedLedger,
    audit,
    audit_entries,
    entry_runs_key,
    entry_sends_key,
    runs_from_journal,
)
from schedproj.chaos.faults import Figures
from schedproj.chaos.processes import PREFIX
from schedproj.chaos.report import awaiting_delivery, collect


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
                                "late_ends": 0, "pool_runs": {}, "pool_overlaps": 0,
                                "pool_fenced_stragglers": 0, "pool_late_ends": 0}


def on(task: str, fence: int, t: float, slots: tuple[int, ...], lane: str = "g") -> dict:
    """The start of a run of pool ``gpu`` on ``slots``."""
    return {**start(task, fence, t, lane), "pool": "gpu", "slots": list(slots)}


def test_pool_runs_are_judged_per_slot_not_against_the_lease_or_each_other() -> None:
    """Two slots of ``gpu`` busy at once beside a default-pool run: no overlap. A third run
    on a slot still busy, or a two-slot run over a one-slot run, is a run beyond the pool's
    slots, found with or without the slots' ledgers."""
    fine = [on("g1", 100, 0, (0,)), on("g2", 101, 1, (1,)), start("h", 1, 1.5),
            end("g1", 100, 4), end("g2", 101, 5), end("h", 1, 6),
            on("both", 102, 6, (0, 1)), end("both", 102, 8)]
    report = audit(fine, [], due_bounds_s={}, window=(0, 10))
    assert report.summary()["pool_runs"] == {"gpu": 3}
    assert report.heavy_runs == 1 and report.light_runs == 0
    assert report.overlaps == [] and report.pool_overlaps == [] and report.stale_starts == []

    beyond = [on("g1", 100, 0, (0,)), on("g2", 101, 1, (1,)), on("g3", 102, 2, (1,)),
              end("g1", 100, 4), end("g2", 101, 5), end("g3", 102, 6),
              on("both", 103, 4.5, (0, 1)), end("both", 103, 8)]
    report = audit(beyond, [], due_bounds_s={}, window=(0, 10))
    assert {(a.task, b.task) for a, b in report.pool_overlaps} == {
        ("g2", "g3"), ("g2", "both"), ("g3", "both")}
    # Given each slot's ledger: g2 wrote on slot 1 after g3 started there (an overlap), g3 did
    # not write after "both" started (a late end); "both" wrote on both slots.
    ledgers = {("gpu", 1): [{"fence": 101, "t": 2.5}, {"fence": 102, "t": 3.0},
                            {"fence": 103, "t": 5.0}],
               ("gpu", 0): [{"fence": 100, "t": 1.0}, {"fence": 103, "t": 5.0}]}
    report = audit(beyond, [], due_bounds_s={}, window=(0, 10), slot_ledgers=ledgers)
    assert [(a.task, b.task) for a, b in report.pool_overlaps] == [("g2", "g3")]
    assert {(a.task, b.task) for a, b in report.pool_late_ends} == {
        ("g2", "both"), ("g3", "both")}


def test_a_pool_run_that_noticed_its_loss_is_a_fenced_straggler_of_its_slot() -> None:
    journal = [on("g1", 100, 0, (0,)), on("g2", 101, 3, (0,)),
               end("g1", 100, 5, lost="lease-unrenewed"), end("g2", 101, 9),
               on("old", 90, 10, (1,)), end("old", 90, 11)]
    report = audit(journal, [], due_bounds_s={}, window=(0, 10))
    assert report.pool_overlaps == [] and [r.task for r in report.pool_fenced_stragglers] == [
        "g1"]
    assert report.stale_starts == []  # fence 90 is the first on slot 1


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
    two = [(2.0, 12.0, {"h"}), (10.0, 20.0, {"h"})]
    assert audit(journal, [], due_bounds_s={"h": 10.0}, window=(0, 27),
                 disruptions=two).lost == []
    one = [(2.0, 6.0, {"h"})]
    assert audit(journal, [], due_bounds_s={"h": 10.0}, window=(0, 27),
                 disruptions=one).lost == [("h", 0.0, 26.0, 4.0)]


def test_a_fault_excuses_only_the_waits_of_the_lanes_it_can_delay() -> None:
    """The same two faults, each naming the lanes it can hold up: h's wait is excused by
    both; l's only by the one that names it (8 s of 26 s), 18 s of its own: lost."""
    journal = [start("a", 1, 0), end("a", 1, 1), start("b", 2, 26), end("b", 2, 27),
               start("l1", 0, 0, lane="l"), end("l1", 0, 1, lane="l"),
               start("l2", 0, 26, lane="l"), end("l2", 0, 27, lane="l")]
    faults = [(2.0, 12.0, {"h"}), (10.0, 20.0, {"h", "l"})]
    assert audit(journal, [], due_bounds_s={"h": 10.0, "l": 10.0}, window=(0, 27),
                 disruptions=faults).lost == [("l", 0.0, 26.0, 10.0)]


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


# -- schedule entries ---------------------------------------------------------------------------

def sent(entry: str, task: str, at: float, count: int | None, t: float | None = None) -> dict:
    return {"entry": entry, "task": task, "at": at, "count": count,
            "t": at + 0.01 if t is None else t}


def ran(entry: str, task: str, t: float) -> dict:
    return {"entry": entry, "task": task, "t": t}


def every_2s(*ats: float, counts: list[int] | None = None) -> list[dict]:
    counts = counts or list(range(1, len(ats) + 1))
    return [sent("e", f"e{i}", at, n) for i, (at, n) in enumerate(zip(ats, counts, strict=True))]


def entry_audit(sends: list[dict], runs: list[dict] | None = None, *,
                faults: list[tuple[float, str, float]] = (), window=(0.0, 10.0)) -> Any:
    runs = [ran(s["entry"], s["task"], s["t"] + 0.1) for s in sends] if runs is None else runs
    names = {s["entry"] for s in sends}
    return audit_entries(sends, runs, intervals={"e": 2.0} if "e" in names else {},
                         minutely=("m",) if "m" in names else (), window=window,
                         slack_s=0.5, faults=faults, state_losses=("restart",),
                         broker_losses=("restart",), beat_kills={"kill-beat": 1}, deliver_s=5.0)


def test_entries_sent_once_per_due_time_have_no_findings() -> None:
    report = entry_audit(every_2s(0.5, 2.6, 4.7, 6.8, 8.9))
    assert report.violations == 0 and report.summary()["entry_sends"] == 5
    assert report.summary()["entry_delayed_after_state_loss"] == 0


def test_an_interval_entry_claimed_twice_for_one_due_time_or_run_twice() -> None:
    twice = entry_audit(every_2s(0.5, 2.6, 3.1, 5.2, 7.3, 9.4))
    assert twice.duplicate_due == [("e", 2.6, 3.1)] and twice.violations == 1
    sends = every_2s(0.5, 2.6, 4.7, 6.8, 8.9)
    runs = [ran("e", s["task"], s["t"] + 0.1) for s in sends] + [ran("e", "e2", 5.0)]
    assert entry_audit(sends, runs).duplicate_runs == [("e", "e2")]


def test_an_interval_entry_waiting_past_its_bound_is_missed_unless_a_fault_covers_it() -> None:
    late = every_2s(0.5, 2.6, 6.0, 8.1)  # 3.4 s after 2.6: bound 2.5
    assert [m[:3] for m in entry_audit(late).missed] == [("e", 2.6, 6.0)]
    covered = entry_audit(late, faults=[(3.0, "kill-beat", 5.0)])
    assert covered.missed == [] and covered.due_during == {"kill-beat": 1}


def test_after_a_state_loss_one_fresh_interval_is_delayed_not_missed() -> None:
    """The state lost at 4.3, just before the due time 4.6 (Redis back and beat noticed by
    4.8): counted from then, the next claim comes an interval later, at 6.8. Later than one
    more interval is missed."""
    fresh = every_2s(0.5, 2.6, 6.8, 8.9, counts=[1, 2, 1, 2])
    report = entry_audit(fresh, faults=[(4.3, "restart", 4.8)])
    assert report.violations == 0 and report.delayed_after_loss == [("e", 2.6, 6.8)]
    assert report.count_rollbacks == []  # a fresh start at 1
    assert entry_audit(fresh).missed, "no state loss: the same wait is a miss"
    worse = entry_audit(every_2s(0.5, 2.6, 9.0, counts=[1, 2, 1]),
                        faults=[(4.3, "restart", 4.8)])
    assert worse.missed and not worse.delayed_after_loss


def test_a_crontab_minute_sent_twice_late_or_not_at_all() -> None:
    window = (0.0, 200.0)
    good = [sent("m", "m1", 60.2, 1), sent("m", "m2", 120.1, 2), sent("m", "m3", 180.3, 3)]
    assert entry_audit(good, window=window).violations == 0
    twice = [*good, sent("m", "m4", 123.0, 4)]
    assert entry_audit(twice, window=window).duplicate_due == [("m", 120.1, 123.0)]
    late = [sent("m", "m1", 60.2, 1), sent("m", "m2", 122.0, 2), sent("m", "m3", 180.3, 3)]
    assert [m[:2] for m in entry_audit(late, window=window).missed] == [("m", 120.0)]
    assert entry_audit(late, window=window, faults=[(119.0, "kill-beat", 121.8)]).missed == []
    gone = [sent("m", "m1", 60.2, 1), sent("m", "m3", 180.3, 2)]
    assert entry_audit(gone, window=window).missed == [("m", 120.0, 180.3, 0.0)]
    lost_state = entry_audit(gone, window=window, faults=[(119.5, "restart", 120.5)])
    assert lost_state.missed == [] and lost_state.skipped_after_loss == [("m", 120.0)]


def test_a_minute_the_run_ended_on_is_judged_only_on_the_time_no_fault_covered() -> None:
    """The short chaos run's last fault killed the active beat 0.5 s before the minute 120;
    the standby announced itself at 123.0 (when the fault's action returns) and the driver
    stopped the fleet before that beat's first tick reached its entries, so no claim came
    before the window's end, 123.4. Of those 3.4 s, 3.0 were the fault: 0.4 s of waiting,
    within the bound (0.5 s here; docs/entries.md: a due time that fell in the gap is sent
    when the standby takes over). Without the fault, or with the window ending later, it is
    a miss."""
    sends = [sent("m", "m1", 60.2, 1)]
    kill = [(119.5, "kill-beat", 123.0)]
    cut_short = entry_audit(sends, window=(0.0, 123.4), faults=kill)
    assert cut_short.missed == [] and cut_short.violations == 0
    assert cut_short.due_during == {"kill-beat": 1}
    assert entry_audit(sends, window=(0.0, 123.4)).missed == [("m", 120.0, 123.4, 0.0)]
    assert entry_audit(sends, window=(0.0, 125.0), faults=kill).missed == [
        ("m", 120.0, 125.0, 3.0)]


def test_a_claim_never_published_is_allowed_only_across_a_beat_kill() -> None:
    skipped = every_2s(0.5, 2.6, 4.7, 6.8, 8.9, counts=[1, 2, 4, 5, 6])
    report = entry_audit(skipped)
    assert report.unsent == [("e", 3)] and report.violations == 1
    killed = entry_audit(skipped, faults=[(2.7, "kill-beat", 2.9)])
    assert killed.unsent == [] and killed.unsent_at_beat_kill == [("e", 3)]
    # Its message ran, but beat died before journaling the publish: not a claim lost.
    unlogged = [ran(s["entry"], s["task"], s["t"] + 0.1) for s in skipped] + \
        [ran("e", "quiet", 3.0)]
    quiet = entry_audit(skipped, unlogged)
    assert quiet.unsent == [] and quiet.unlogged_runs == ["quiet"]


def test_a_due_time_whose_claim_died_with_beat_is_accounted_for_not_missed() -> None:
    """A beat killed between a claim and its publish: that due time is not sent (documented),
    and the count skipped says so; the minute (or interval) it took is not also a miss. A
    minute lost with no count skipped, or a count skipped with no beat killed, still is."""
    window = (0.0, 250.0)
    lost = [sent("m", "m1", 60.2, 1), sent("m", "m3", 180.3, 3), sent("m", "m4", 240.1, 4)]
    killed = entry_audit(lost, window=window, faults=[(120.1, "kill-beat", 123.0)])
    assert killed.missed == [] and killed.unsent_at_beat_kill == [("m", 2)]
    assert killed.violations == 0
    unkilled = entry_audit(lost, window=window)
    assert unkilled.unsent == [("m", 2)] and [m[:2] for m in unkilled.missed] == [("m", 120.0)]
    no_gap = [sent("m", "m1", 60.2, 1), sent("m", "m3", 180.3, 2), sent("m", "m4", 240.1, 3)]
    assert entry_audit(no_gap, window=window, faults=[(120.1, "kill-beat", 123.0)]).missed
    # Two minutes gone, one count skipped: one is accounted for, the other is missed.
    two = [sent("m", "m1", 60.2, 1), sent("m", "m4", 240.1, 3)]
    report = entry_audit(two, window=window, faults=[(120.1, "kill-beat", 123.0)])
    assert [m[:2] for m in report.missed] == [("m", 180.0)]
    # An interval entry: the claim lost at the kill held one interval of the gap.
    every = entry_audit(every_2s(0.5, 2.6, 6.8, 8.9, counts=[1, 2, 4, 5]),
                        faults=[(4.7, "kill-beat", 4.75)])
    assert every.missed == [] and every.unsent_at_beat_kill == [("e", 3)]


def test_the_state_at_the_end_tells_of_a_last_claim_never_published() -> None:
    """No later claim shows the count skipped when the beat killed between a claim and its
    publish made the last claim of the run (the short run sees one or two minutes): the
    entry's state read as the fleet stops does (claimed at 120.02, count 2). Killed just
    after: accounted for, not missed. No beat killed: a claim never sent, and the minute
    missed. A state lost since (count back at 0) or as the last claim left it tells nothing."""
    window = (0.0, 150.0)
    sends = [sent("m", "m1", 60.2, 1)]

    def audited(final: dict, faults: list = ()) -> Any:
        return audit_entries(sends, [ran("m", "m1", 60.4)], intervals={}, minutely=("m",),
                             window=window, slack_s=0.5, faults=faults,
                             state_losses=("restart",), broker_losses=("restart",),
                             beat_kills={"kill-beat": 1}, deliver_s=5.0, final_states=final)

    killed = audited({"m": (120.02, 2)}, faults=[(120.03, "kill-beat", 123.0)])
    assert killed.missed == [] and killed.unsent_at_beat_kill == [("m", 2)]
    assert killed.violations == 0
    unkilled = audited({"m": (120.02, 2)})
    assert unkilled.unsent == [("m", 2)] and [m[:2] for m in unkilled.missed] == [("m", 120.0)]
    for told_nothing in ({"m": (60.2, 1)}, {"m": (125.0, 0)}, {}):
        report = audited(told_nothing, faults=[(120.03, "kill-beat", 123.0)])
        assert report.unsent_at_beat_kill == [] and report.missed, told_nothing
    # The run's first claim: the count it skipped is counted from the fresh state's 0.
    first = audit_entries([], [], intervals={}, minutely=("m",), window=(60.0, 150.0),
                          slack_s=0.5, faults=[(120.03, "kill-beat", 123.0)],
                          state_losses=(), broker_losses=(), beat_kills={"kill-beat": 1},
                          deliver_s=5.0, final_states={"m": (120.02, 1)})
    assert first.missed == [] and first.unsent_at_beat_kill == [("m", 1)]


def test_a_count_going_back_reads_a_state_older_than_the_last_claim() -> None:
    report = entry_audit(every_2s(0.5, 2.6, 4.7, 6.8, 8.9, counts=[1, 2, 3, 3, 4]))
    assert report.count_rollbacks == [("e", 3, 3)]


def test_a_published_message_never_run_is_lost_with_the_broker_or_undelivered() -> None:
    sends = every_2s(0.5, 2.6, 4.7, 6.8, 8.9)
    runs = [ran("e", s["task"], s["t"] + 0.1) for s in sends if s["task"] != "e1"]
    assert entry_audit(sends, runs).undelivered == ["e1"]
    restarted = entry_audit(sends, runs, faults=[(3.0, "restart", 3.5)])
    assert restarted.undelivered == [] and restarted.lost_with_broker == ["e1"]


def test_a_claim_recorded_long_before_its_publish_is_told() -> None:
    """A tick that stalled 3 s before its entries recorded its start as the run's time."""
    sends = every_2s(0.5, 2.6, 4.7, 6.8, 8.9)
    sends[2]["began"], sends[3]["began"] = 7.7, 6.9
    assert entry_audit(sends).recorded_early == [("e", 4.7, 7.7)]


def test_a_message_published_while_the_broker_restarts_went_with_it() -> None:
    """The fault began (waiting for a heavy run) before the publish; the restart came after."""
    sends = every_2s(0.5, 2.6, 4.7, 6.8, 8.9)
    runs = [ran("e", s["task"], s["t"] + 0.1) for s in sends if s["task"] != "e2"]
    report = entry_audit(sends, runs, faults=[(4.0, "restart", 5.5)])
    assert report.undelivered == [] and report.lost_with_broker == ["e2"]


@dataclass
class AuditRedis:
    """Where the chaos audit Redis is (``collect`` reads only its ``url``): here, the tests'."""

    url: str


def test_the_run_is_audited_until_the_driver_began_stopping_the_fleet(
        redis_client: redis.Redis, redis_url: str) -> None:
    """The entries were sent on time until the driver began stopping the fleet at 1080; the
    fleet took 6 s to stop (a heavy run finishing). The minute 1080 and the intervals due
    while it stopped are nobody's to send: not missed. Had the fleet run on unsent until
    then, they would be."""
    for key in redis_client.scan_iter(f"{PREFIX}:*"):
        redis_client.delete(key)
    sends = [{"entry": name, "task": f"{name}-{i}", "at": t, "count": i + 1, "t": t + 0.01}
             for name, every in ENTRY_INTERVALS.items()
             for i, t in enumerate(1000.2 + every * k for k in range(int(79 // every) + 1))]
    sends.append({"entry": ENTRY_MINUTELY, "task": "m-0", "at": 1020.1, "count": 1,
                  "t": 1020.11})
    for s in sends:
        redis_client.rpush(entry_sends_key(PREFIX), json.dumps(s))
        redis_client.rpush(entry_runs_key(PREFIX), json.dumps(
            {"entry": s["entry"], "task": s["task"], "t": s["t"] + 0.1}))
    try:
        report = collect(AuditRedis(redis_url), Figures(), 1000.0, 1086.0, stopping=1080.0)
        assert report["entry_sends"] == len(sends) and report["entry_runs"] == len(sends)
        assert report["entry_missed"] == 0, report["details"]["entries"]
        ran_on = collect(AuditRedis(redis_url), Figures(), 1000.0, 1086.0, stopping=1086.0)
        missed = ran_on["details"]["entries"]["missed"]
        assert {m[0] for m in missed} == {*ENTRY_INTERVALS, ENTRY_MINUTELY}, missed
    finally:
        for key in redis_client.scan_iter(f"{PREFIX}:*"):
            redis_client.delete(key)


def test_the_messages_the_light_worker_still_owes_as_the_fleet_stops(
        redis_client: redis.Redis) -> None:
    """Beat stopped at 100: of the entry messages it published in the delivery time before,
    those not run yet are awaited before the workers stop (one published long before and
    never run is the audit's to judge, not waited for)."""
    for key in redis_client.scan_iter(f"{PREFIX}:*"):
        redis_client.delete(key)
    try:
        for task, t in (("old", 80.0), ("done", 99.0), ("owed", 99.9)):
            redis_client.rpush(entry_sends_key(PREFIX), json.dumps(
                {"entry": "e", "task": task, "t": t, "at": t, "count": 1}))
        redis_client.rpush(entry_runs_key(PREFIX), json.dumps(
            {"entry": "e", "task": "done", "t": 99.1}))
        assert awaiting_delivery(redis_client, 90.0) == ["owed"]
        redis_client.rpush(entry_runs_key(PREFIX), json.dumps(
            {"entry": "e", "task": "owed", "t": 100.5}))
        assert awaiting_delivery(redis_client, 90.0) == []
        assert awaiting_delivery(redis_client, 0.0) == ["old"]
    finally:
        for key in redis_client.scan_iter(f"{PREFIX}:*"):
            redis_client.delete(key)
