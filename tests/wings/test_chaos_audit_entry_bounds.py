"""The chaos entry audit is not too lenient (an adversarial review of dfdd0a8 and 0ac50b6):
fault time excuses an entry's wait only for the faults that can hold beat's entries step up,
a beat killed loses at most one claim of an entry, and every minute whose bound ends inside
the window is judged. Pure journal input to the real audit (no Redis)."""

from __future__ import annotations

from tests.wings.test_chaos_audit import entry_audit, sent


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
