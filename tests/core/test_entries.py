"""The schedule entries' rule (``core.entries``): what a tick sends and when it looks again."""

from __future__ import annotations

import pytest

from schedproj.core.entries import (
    BROKEN_LOOK_S,
    MIN_LOOK_S,
    PAUSED_LOOK_S,
    CalendarTiming,
    EntryDefinition,
    EntryState,
    check_entry_name,
    plan_entries,
)
from schedproj.core.errors import StateError
from schedproj.core.schedules import OneOffFireTimes

NOW = 1_000_000.0


class Every:
    """An interval schedule as Celery's ``schedule.is_due`` answers: due once ``seconds``
    passed since the last run; next look after a run is a whole interval."""

    def __init__(self, seconds: float, now: float = NOW) -> None:
        self.seconds, self.now = seconds, now

    def check(self, last_run_at: float) -> tuple[bool, float]:
        left = last_run_at + self.seconds - self.now
        return (True, self.seconds) if left <= 0 else (False, left)


class Raising:
    def check(self, last_run_at: float) -> tuple[bool, float]:
        raise RuntimeError("boom")


def state(last: float, count: int = 0, key: str = "k") -> str:
    return EntryState(last_run_at=last, total_run_count=count, schedule_key=key).encode()


def test_a_due_entry_is_claimed_against_the_state_read() -> None:
    raw = state(NOW - 61, count=4)
    plan = plan_entries(["a"], {"a": raw}, {"a": Every(60)}, {"a": "k"}, NOW)
    (claim,) = plan.claims
    assert claim.expected == raw, "the compare-and-set must compare with what was read"
    assert claim.state == EntryState(last_run_at=NOW, total_run_count=5, schedule_key="k")
    assert claim.next_look == NOW + 60 and not claim.forced
    assert not plan.looks and not plan.starts


def test_an_entry_not_yet_due_is_looked_at_when_its_schedule_says() -> None:
    plan = plan_entries(["a"], {"a": state(NOW - 20)}, {"a": Every(60)}, {"a": "k"}, NOW)
    assert not plan.claims and plan.looks == {"a": NOW + 40}


def test_a_new_entry_counts_from_now_and_is_not_sent_for_being_new() -> None:
    plan = plan_entries(["a"], {"a": None}, {"a": Every(60)}, {"a": "k"}, NOW)
    assert not plan.claims
    (start,) = plan.starts
    assert start.expected is None and start.state == EntryState(NOW, 0, "k")
    assert start.next_look == NOW + 60


def test_a_changed_schedule_starts_from_its_new_definition() -> None:
    plan = plan_entries(["a"], {"a": state(NOW - 3600, count=9, key="old")}, {"a": Every(60)},
                        {"a": "new"}, NOW)
    assert not plan.claims
    (start,) = plan.starts
    assert start.state == EntryState(NOW, 0, "new")


def test_a_paused_entry_is_never_sent() -> None:
    plan = plan_entries(["a"], {"a": state(NOW - 600)}, {"a": Every(60)}, {"a": "k"}, NOW,
                        paused=frozenset({"a"}))
    assert not plan.claims and plan.looks == {"a": NOW + PAUSED_LOOK_S}


def test_run_now_sends_an_entry_that_is_not_due_and_counts_it_as_a_run() -> None:
    plan = plan_entries(["a"], {"a": state(NOW - 10, count=1)}, {"a": Every(60)}, {"a": "k"},
                        NOW, forced=frozenset({"a"}))
    (claim,) = plan.claims
    assert claim.forced and claim.state.total_run_count == 2
    assert claim.next_look == NOW + 60


def test_a_removed_entry_with_state_is_listed_for_deletion() -> None:
    plan = plan_entries(["gone", "never"], {"gone": state(NOW), "never": None}, {}, {}, NOW)
    assert plan.removed == ("gone",)


def test_a_schedule_that_raises_is_reported_and_looked_at_later() -> None:
    plan = plan_entries(["a"], {"a": state(NOW - 600)}, {"a": Raising()}, {"a": "k"}, NOW)
    assert "RuntimeError: boom" in plan.errors["a"]
    assert plan.looks == {"a": NOW + BROKEN_LOOK_S} and not plan.claims


def test_an_unreadable_state_is_replaced_by_one_counting_from_now() -> None:
    plan = plan_entries(["a"], {"a": "{not json"}, {"a": Every(60)}, {"a": "k"}, NOW)
    assert "unreadable" in plan.errors["a"] and "replaced" in plan.errors["a"]
    (start,) = plan.starts
    assert start.expected == "{not json" and start.state.last_run_at == NOW


def test_next_looks_are_capped_and_floored() -> None:
    far = plan_entries(["a"], {"a": state(NOW)}, {"a": Every(86400)}, {"a": "k"}, NOW,
                       max_look_s=300)
    assert far.looks == {"a": NOW + 300}
    near = plan_entries(["a"], {"a": state(NOW - 60 + 1e-6)}, {"a": Every(60)}, {"a": "k"},
                        NOW)
    assert near.looks == {"a": NOW + MIN_LOOK_S}


def test_state_round_trips_and_garbage_is_refused() -> None:
    s = EntryState(last_run_at=12.5, total_run_count=3, schedule_key="<crontab>")
    assert EntryState.decode(s.encode(), "k") == s
    for bad in ('{"v":1,"last_run_at":-1}', '{"v":1,"last_run_at":1,"total_run_count":true}',
                '{"v":2,"last_run_at":1}', "[]"):
        with pytest.raises(StateError):
            EntryState.decode(bad, "k")


def test_runtime_definitions_are_checked_with_the_fix() -> None:
    d = EntryDefinition.build(task="shop.cleanup", cron="0  3 * * *", args=[1],
                              kwargs={"x": 2}, options={"queue": "q"})
    assert d.cron == "0 3 * * *"
    assert EntryDefinition.decode(d.encode(), "k") == d
    cases = [
        ({"task": "t"}, "exactly one schedule"),
        ({"task": "t", "every_s": 1, "cron": "* * * * *"}, "exactly one schedule"),
        ({"task": "t", "every_s": -5}, "positive number"),
        ({"task": "t", "every_s": float("nan")}, "positive number"),
        ({"task": "t", "cron": "* * *"}, "five fields"),
        ({"task": "", "every_s": 5}, "task name"),
        ({"task": "t", "every_s": 5, "args": {"a": 1}}, "JSON list"),
        ({"task": "t", "every_s": 5, "kwargs": [1]}, "JSON object"),
        ({"task": "t", "every_s": 5, "options": {"link": "x"}}, "unknown message option"),
    ]
    for kwargs, says in cases:
        with pytest.raises(ValueError, match=says):
            EntryDefinition.build(**kwargs)


def test_entry_names_are_ones_operators_can_type() -> None:
    assert check_entry_name("nightly-report.v2") == "nightly-report.v2"
    for bad in ("", "-x", "a b", "x" * 201, "a\x00b"):
        with pytest.raises(ValueError, match="entry name"):
            check_entry_name(bad)


# -- memory, unreadable one-offs, key formats (test_entry_attacks' fixes, pure) -------------

def test_a_stored_state_older_than_the_remembered_one_is_judged_from_memory_and_rewritten(
        ) -> None:
    """Redis restored from an older copy: the due time beat just sent is not sent again."""
    plan = plan_entries(["a"], {"a": state(NOW - 120, count=3)}, {"a": Every(60)},
                        {"a": "k"}, NOW, remembered={"a": (NOW - 10, 4)})
    assert not plan.claims
    (record,) = plan.records
    assert (record.state.last_run_at, record.state.total_run_count) == (NOW - 10, 4)
    assert record.expected == state(NOW - 120, count=3)


def test_a_newer_stored_state_wins_over_memory() -> None:
    plan = plan_entries(["a"], {"a": state(NOW - 120, count=3)}, {"a": Every(60)},
                        {"a": "k"}, NOW, remembered={"a": (NOW - 600, 2)})
    (claim,) = plan.claims
    assert claim.before is not None and claim.before.last_run_at == NOW - 120


def test_a_missing_state_is_put_back_from_memory() -> None:
    plan = plan_entries(["a"], {"a": None}, {"a": Every(60)}, {"a": "k"}, NOW,
                        remembered={"a": (NOW - 10, 4)})
    (start,) = plan.starts
    assert start.expected is None and start.state == EntryState(NOW - 10, 4, "k")


def test_an_unreadable_one_off_state_counts_from_now_and_stays_spent() -> None:
    class OneOff:
        calendar = CalendarTiming(OneOffFireTimes(NOW - 60))

        def check(self, last_run_at: float) -> tuple[bool, float]:
            raise AssertionError("judged by its calendar")

    unreadable = plan_entries(["a"], {"a": "{not json"}, {"a": OneOff()}, {"a": "k"}, NOW)
    assert not unreadable.claims and unreadable.starts[0].state.last_run_at == NOW
    # Never seen (no state stored): it counts from before its instant and runs once.
    new = plan_entries(["a"], {"a": None}, {"a": OneOff()}, {"a": "k"}, NOW)
    (claim,) = new.claims
    assert claim.before is not None and claim.before.last_run_at < NOW - 60


def test_a_state_of_the_earlier_key_format_measures_from_its_schedule() -> None:
    """A key format 1 state ("base", before keys named a crontab's own zone) measures from
    "base | zone=X" and is rewritten in the current format; a format 2 state does not."""
    legacy = '{"v":1,"last_run_at":%r,"total_run_count":2,"schedule_key":"base"}' % (NOW - 5)
    plan = plan_entries(["a"], {"a": legacy}, {"a": Every(60)}, {"a": "base | zone=X"}, NOW)
    (record,) = plan.records
    assert record.state == EntryState(NOW - 5, 2, "base | zone=X")
    current = plan_entries(["a"], {"a": state(NOW - 5, count=2, key="base")}, {"a": Every(60)},
                           {"a": "base | zone=X"}, NOW)
    (start,) = current.starts
    assert start.state == EntryState(NOW, 0, "base | zone=X")
