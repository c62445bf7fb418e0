"""The chaos entry audit is not too lenient (an adversarial review of dfdd0a8 and 0ac50b6):
fault time excuses an entry's wait only for the faults that can hold beat's entries step up,
a beat killed loses at most one claim of an entry, and every minute whose bound ends inside
the window is judged. Pure journal input to the real audit (no Redis)."""

from __future__ import annotations

from typing import Any

from schedproj.chaos.audit import audit_entries
from tests.wings.test_chaos_audit import entry_audit, every_2s, ran, sent


def minutely_audit(sends: list[dict], *, window: tuple[float, float],
                   faults: list[tuple[float, str, float]] = (),
                   final: dict[str, tuple[float, int]] | None = None) -> Any:
    """The audit of the crontab entry ``m`` whose publishes all ran, as the chaos run's
    report calls it (a freeze kills two beats, block-redis stalls beat)."""
    return audit_entries(sends, [ran(s["entry"], s["task"], s["t"] + 0.2) for s in sends],
                         intervals={}, minutely=("m",), window=window, slack_s=0.5,
                         faults=faults, state_losses=("restart",), broker_losses=("restart",),
                         beat_kills={"kill-beat": 1, "freeze-beat": 2},
                         beat_stalls=("block-redis",), deliver_s=5.0,
                         final_states=final or {})


def test_a_minute_beat_skipped_with_no_fault_near_it_is_missed() -> None:
    sends = [sent("m", "m1", 60.2, 1), sent("m", "m3", 180.3, 2)]
    assert entry_audit(sends, window=(0.0, 200.0)).missed == [("m", 120.0, 180.3, 0.0)]
    far = entry_audit(sends, window=(0.0, 200.0), faults=[(10.0, "kill-beat", 50.0)])
    assert [m[:2] for m in far.missed] == [("m", 120.0)]
    assert [m[:2] for m in entry_audit([sent("m", "m1", 60.2, 1)],
                                        window=(0.0, 122.0)).missed] == [("m", 120.0)]


def test_a_minute_whose_bound_ended_less_than_a_second_before_the_window_is_judged() -> None:
    """range(.., int(hi - slack_s)) left out a minute whose bound (120.5 here) ended within
    the last second of the window: unclaimed at 121.0 (1.0 s waited, slack 0.5) or 120.6, it
    was never judged. One whose bound has not passed (window's end 120.4) is not judged."""
    for hi in (121.0, 120.6):
        report = entry_audit([sent("m", "m1", 60.2, 1)], window=(0.0, hi))
        assert report.missed == [("m", 120.0, hi, 0.0)], hi
    assert entry_audit([sent("m", "m1", 60.2, 1)], window=(0.0, 120.4)).missed == []


def test_a_fault_that_left_beat_and_redis_alone_excuses_no_entry_wait() -> None:
    """A heavy worker paused across the minute (beat, its lock and Redis untouched), the
    window ending 2.4 s after it: beat had 2.4 s to claim minute 120 and never did - missed,
    as it is with no fault. Redis frozen (block-redis, a beat stall) or beat killed across the
    same span does hold beat's entries step up: 0.4 s left, within the bound."""
    sends = [sent("m", "m1", 60.2, 1)]
    for kind in ("pause-heavy", "kill-heavy", "corrupt-derived"):
        report = minutely_audit(sends, window=(0.0, 122.4), faults=[(119.0, kind, 122.0)])
        assert report.missed == [("m", 120.0, 122.4, 0.0)], kind
    for kind in ("block-redis", "kill-beat", "freeze-beat", "restart"):
        report = minutely_audit(sends, window=(0.0, 122.4), faults=[(119.0, kind, 122.0)])
        assert report.missed == [], kind
    # An interval entry claimed 4 s late across a heavy worker's pause: late.
    late = entry_audit(every_2s(0.5, 2.6, 8.7), faults=[(2.7, "pause-heavy", 8.0)])
    assert [m[:3] for m in late.missed] == [("e", 2.6, 8.7)]
    assert entry_audit(every_2s(0.5, 2.6, 8.7), faults=[(2.7, "kill-beat", 8.0)]).missed == []


def test_one_beat_kill_accounts_for_one_unpublished_claim_of_an_entry_the_rest_unsent() -> None:
    """Counts 1 -> 4 across one kill: the killed beat lost at most one claim of the entry (a
    tick claims an entry once and publishes its claims before it claims again); the standby
    then claimed minutes 180 and 240 and never published them - claimed and not sent, a
    violation each, and their minutes missed. Told by the state at the end, or by a later
    published claim's count."""
    kill = [(120.03, "kill-beat", 123.0)]
    told_at_end = minutely_audit([sent("m", "m1", 60.2, 1)], window=(0.0, 250.0), faults=kill,
                                 final={"m": (240.02, 4)})
    assert told_at_end.unsent_at_beat_kill == [("m", 2)]
    assert told_at_end.unsent == [("m", 3), ("m", 4)]
    assert [m[:2] for m in told_at_end.missed] == [("m", 180.0), ("m", 240.0)]
    told_later = minutely_audit([sent("m", "m1", 60.2, 1), sent("m", "m5", 300.1, 5)],
                                window=(0.0, 310.0), faults=kill)
    assert told_later.unsent_at_beat_kill == [("m", 2)]
    assert told_later.unsent == [("m", 3), ("m", 4)]
    assert [m[:2] for m in told_later.missed] == [("m", 180.0), ("m", 240.0)]
    # An interval entry: two counts skipped across one kill, one is unsent.
    every = entry_audit(every_2s(0.5, 2.6, 8.9, counts=[1, 2, 5]),
                        faults=[(4.7, "kill-beat", 4.75)])
    assert every.unsent_at_beat_kill == [("e", 3)] and every.unsent == [("e", 4)]


def test_each_beat_a_fault_kills_may_take_one_unpublished_claim_with_it() -> None:
    """Two kills between the published claims, or a freeze (it kills the active beat, and
    the frozen one at its end: two beats that may have held the lock): two claims lost."""
    sends = [sent("m", "m1", 60.2, 1), sent("m", "m4", 240.1, 4)]
    two_kills = minutely_audit(sends, window=(0.0, 250.0), faults=[
        (120.03, "kill-beat", 123.0), (180.05, "kill-beat", 183.0)])
    assert two_kills.unsent_at_beat_kill == [("m", 2), ("m", 3)] and two_kills.violations == 0
    freeze = minutely_audit(sends, window=(0.0, 250.0), faults=[(120.03, "freeze-beat", 190.0)])
    assert freeze.unsent_at_beat_kill == [("m", 2), ("m", 3)] and freeze.violations == 0


def test_a_claim_made_after_every_kill_and_long_before_the_stop_was_not_lost_at_a_kill() -> None:
    """The state at the end says the standby claimed minute 180 (count 2) and never published
    it; the only kill (120.03) came before that claim and the fleet stopped 20 s after it: no
    beat died holding it, so it is unsent, and minutes 120 and 180 are missed. The standby's
    catch-up claim of minute 120 made just before the stop (which stops beat too) is
    accounted for."""
    sends = [sent("m", "m1", 60.2, 1)]
    kill = [(120.03, "kill-beat", 123.0)]
    after_kill = minutely_audit(sends, window=(0.0, 200.0), faults=kill,
                                final={"m": (180.02, 2)})
    assert after_kill.unsent == [("m", 2)] and after_kill.unsent_at_beat_kill == []
    assert [m[:2] for m in after_kill.missed] == [("m", 120.0), ("m", 180.0)]
    at_stop = minutely_audit(sends, window=(0.0, 124.0), faults=kill, final={"m": (123.5, 2)})
    assert at_stop.unsent_at_beat_kill == [("m", 2)] and at_stop.violations == 0
