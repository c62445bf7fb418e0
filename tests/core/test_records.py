"""Lane records as stored (core/records.py): every record round-trips through its versioned
JSON, fields added later stay out while unset, and a record of the wrong shape is a StateError
naming the key, so garbage never reaches the picker."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedproj.core import codec, records, schedules
from schedproj.core.defaults import STATE_VERSION
from schedproj.core.deferrals import Deferral
from schedproj.core.errors import StateError
from schedproj.core.lanes import DeferralReason
from schedproj.core.records import (
    LaneState,
    LeaseView,
    Outcome,
    RunRecord,
    SchedRecord,
    decode,
    encode,
    new_state,
)

DEFERRAL = Deferral(lane="a", reason=DeferralReason.DEPENDENCY, blocker="b", since=10.0,
                    blocker_since=12.5, gate_blocker="c")
FULL_RUN = RunRecord(last_run_at=1.5, last_outcome=Outcome.FAILED, last_reason="boom",
                     last_task_id="t1", backlog=3, runs=4, failures=2, running_task_id="t2",
                     running_since=2.0, running_until=3.0, fence=9, failing_since=0.5,
                     skipped_task_id="t0", since=0.25)
FULL_SCHED = SchedRecord(inflight_task_id="t3", inflight_deadline=4.0, last_dispatch_at=3.5,
                         dispatches=6, deferral=DEFERRAL, paused=True)
FULL_LEASE = LeaseView(lane="a", token="tok", fence=3, granted_at=1.0, started_at=2.0,
                       task_id="t4", host="h", pid=42, node="n@h", epoch=5, reasserted=True)


@pytest.mark.parametrize("record", [RunRecord(), SchedRecord(), FULL_RUN, FULL_SCHED,
                                    FULL_LEASE, LeaseView("a", "t", 1, 0.0)])
def test_every_record_round_trips(record: Any) -> None:
    assert decode(type(record), encode(record), "k") == record


def test_the_encoding_is_versioned_json_of_every_field() -> None:
    data = json.loads(encode(FULL_SCHED))
    assert data["v"] == STATE_VERSION
    assert data["deferral"] == {"lane": "a", "reason": "dependency-backpressure",
                                "blocker": "b", "since": 10.0, "blocker_since": 12.5,
                                "gate_blocker": "c"}
    assert next(iter(data)) == "v"


def test_a_field_added_later_is_left_out_while_unset() -> None:
    assert "since" not in json.loads(encode(RunRecord()))
    assert json.loads(encode(RunRecord(since=5.0)))["since"] == 5.0
    assert "running_since" not in json.loads(encode(RunRecord()))


def test_encoding_leaves_the_record_itself_alone() -> None:
    encode(FULL_SCHED)
    encode(RunRecord())
    assert FULL_SCHED.deferral is DEFERRAL
    assert RunRecord().since is None


def test_a_lane_state_defaults_to_empty_records() -> None:
    assert LaneState() == LaneState(run=RunRecord(), sched=SchedRecord())


def test_the_lease_token_stays_out_of_repr() -> None:
    assert "tok" not in repr(FULL_LEASE)


def stored(**fields: Any) -> str:
    return json.dumps({"v": STATE_VERSION, **fields})


@pytest.mark.parametrize(
    ("cls", "raw", "problem"),
    [(RunRecord, stored(mystery=1), "unknown fields ['mystery']"),
     (RunRecord, stored(last_run_at="yesterday"), "last_run_at must be a number"),
     (RunRecord, stored(runs=True), "runs must be a number"),
     (RunRecord, stored(backlog=[1]), "backlog must be a number"),
     (RunRecord, stored(last_reason=5), "last_reason must be a string"),
     (RunRecord, stored(last_outcome="exploded"), "bad field value"),
     (SchedRecord, stored(paused="yes"), "paused must be true or false"),
     (SchedRecord, stored(paused=1), "paused must be true or false"),
     (SchedRecord, stored(deferral="x"), "deferral must be an object"),
     (SchedRecord, stored(deferral={"lane": "a", "reason": "dependency-backpressure"}),
      "deferral lacks ['since']"),
     (SchedRecord, stored(deferral={"lane": "a", "since": 1}),
      "deferral lacks ['reason']"),
     (SchedRecord, stored(deferral={"lane": "a", "reason": "nope", "blocker": None,
                                    "since": 1}), "bad field value"),
     (SchedRecord, stored(deferral={"lane": "a", "reason": "dependency-backpressure",
                                    "blocker": None, "since": "then"}),
      "since must be a number"),
     (SchedRecord, stored(deferral={"lane": "a", "reason": "dependency-backpressure",
                                    "blocker": None, "since": 1, "extra": 2}),
      "bad field value"),
     (LeaseView, stored(lane="a", token="t", fence="1", granted_at=1.0),
      "fence must be a number"),
     (LeaseView, stored(lane="a", token="t", fence=1), "bad field value")],
)
def test_a_record_of_the_wrong_shape_names_the_key_and_the_field(
        cls: type[Any], raw: str, problem: str) -> None:
    with pytest.raises(StateError) as caught:
        decode(cls, raw, "p:lanes:a|run")
    assert caught.value.key == "p:lanes:a|run"
    assert problem in caught.value.problem


@pytest.mark.parametrize("value", ["NaN", "Infinity", "1e999"])
def test_a_non_finite_time_is_refused(value: str) -> None:
    raw = stored().replace("}", f', "last_run_at": {value}}}')
    with pytest.raises(StateError, match="not valid JSON") as caught:
        decode(RunRecord, raw, "p:lanes:a|run")
    assert caught.value.key == "p:lanes:a|run"


def test_the_first_decode_of_each_record_kind_checks_its_fields(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Field types are worked out once per record class and kept: a cold start must check too.
    monkeypatch.setattr(records, "_FIELD_TYPES", {})
    monkeypatch.setattr(records, "_FIELD_NAMES", {})
    assert decode(RunRecord, encode(FULL_RUN), "k") == FULL_RUN
    with pytest.raises(StateError, match="unknown fields"):
        decode(SchedRecord, stored(nope=1), "k")
    with pytest.raises(StateError, match="fence must be a number"):
        decode(LeaseView, stored(lane="a", token="t", fence="1", granted_at=1.0), "k")
    assert set(records._FIELD_TYPES) == {RunRecord, SchedRecord, LeaseView}
    assert set(records._FIELD_NAMES) == {RunRecord, SchedRecord, LeaseView}


def test_a_finite_float_built_from_a_huge_integer_cannot_slip_in() -> None:
    with pytest.raises(StateError, match="running_until"):
        decode(RunRecord, stored().replace("}", ', "running_until": ' + "9" * 400 + "}"), "k")


def test_integers_are_accepted_where_a_time_is_expected() -> None:
    assert decode(RunRecord, stored(last_run_at=5), "k").last_run_at == 5
    assert decode(SchedRecord, stored(paused=False), "k") == SchedRecord()


# -- the compact encoding (issue 23: a million lanes keep two records each) ----------------------

#: The full texts the earlier release wrote (every field, nulls and zeros included).
EARLIER_RUN = ('{"v":1,"last_run_at":1.5,"last_outcome":"completed","last_reason":null,'
               '"last_task_id":"t1","backlog":0,"runs":1,"failures":0,"running_task_id":null,'
               '"running_since":null,"running_until":null,"fence":0,"failing_since":null,'
               '"skipped_task_id":null}')
EARLIER_SCHED = ('{"v":1,"inflight_task_id":"t1","inflight_deadline":61.5,'
                 '"last_dispatch_at":0.5,"dispatches":1,"deferral":null,"paused":false}')


def _earlier_decode(cls: Any, raw: str) -> Any:
    """How the earlier release read a record: every stored field given to the dataclass, a
    missing one left to its default (it refused only fields it does not know)."""
    data = json.loads(raw)
    assert data.pop("v") == STATE_VERSION
    if data.get("last_outcome") is not None:
        data["last_outcome"] = Outcome(data["last_outcome"])
    if data.get("deferral") is not None:
        data["deferral"] = Deferral(**{**data["deferral"],
                                       "reason": DeferralReason(data["deferral"]["reason"])})
    return cls(**data)


def test_a_run_and_sched_record_leave_out_the_fields_holding_their_default() -> None:
    run = RunRecord(last_run_at=1.5, last_outcome=Outcome.COMPLETED, last_task_id="t1", runs=1)
    sched = SchedRecord(inflight_task_id="t1", inflight_deadline=61.5, last_dispatch_at=0.5,
                        dispatches=1)
    assert json.loads(encode(run)) == {"v": 1, "last_run_at": 1.5, "last_outcome": "completed",
                                       "last_task_id": "t1", "runs": 1}
    assert json.loads(encode(sched)) == {"v": 1, "inflight_task_id": "t1",
                                         "inflight_deadline": 61.5, "last_dispatch_at": 0.5,
                                         "dispatches": 1}
    assert len(encode(run)) < 0.7 * len(EARLIER_RUN)
    assert len(encode(sched)) < 0.85 * len(EARLIER_SCHED)


def test_the_in_flight_marks_are_left_out_while_null() -> None:
    """Written up to 2a75607 even when null (its run_finish.lua and run_cas.lua rewrote them
    in place); the Lua now adds a missing one (tests/store/test_run_marks.py), and 65 bytes
    fewer per run record move it from the 224-byte to the 160-byte allocation class."""
    marks = ("running_task_id", "running_since", "running_until")
    for record in (RunRecord(), RunRecord(since=2.0)):
        assert not any(f'"{name}":' in encode(record) for name in marks)
    assert all(f'"{name}":' in encode(FULL_RUN) for name in marks)
    started = RunRecord(running_task_id="t2", running_since=2.0, running_until=3.0)
    assert decode(RunRecord, encode(started), "k") == started


def test_values_that_only_equal_the_default_are_kept() -> None:
    # A float 0.0 is a time (epoch 0), not the int default of a counter; None-defaulted
    # fields with a falsy value are kept too.
    data = json.loads(encode(RunRecord(last_run_at=0.0, last_reason="", backlog=0)))
    assert data["last_run_at"] == 0.0 and data["last_reason"] == ""
    assert "backlog" not in data
    assert json.loads(encode(SchedRecord(paused=True)))["paused"] is True


@pytest.mark.parametrize("record", [RunRecord(), SchedRecord(), FULL_RUN, FULL_SCHED,
                                    RunRecord(since=3.0, runs=2),
                                    SchedRecord(missed_through=5.0, missed=0)])
def test_the_earlier_release_reads_the_short_records(record: Any) -> None:
    """A rolling deploy: a beat or worker of the earlier release meets records this one
    wrote."""
    assert _earlier_decode(type(record), encode(record)) == record


def test_this_release_reads_the_earlier_full_records() -> None:
    assert decode(RunRecord, EARLIER_RUN, "k") == RunRecord(
        last_run_at=1.5, last_outcome=Outcome.COMPLETED, last_task_id="t1", runs=1)
    assert decode(SchedRecord, EARLIER_SCHED, "k") == SchedRecord(
        inflight_task_id="t1", inflight_deadline=61.5, last_dispatch_at=0.5, dispatches=1)


def test_the_lease_keeps_every_field() -> None:
    assert set(json.loads(encode(LeaseView("a", "t", 1, 0.0)))) >= {
        "v", "lane", "token", "fence", "granted_at", "started_at", "task_id", "reasserted"}


# -- times to the microsecond (issue 23: the sched record's 160-byte class) ---------------------

#: A moment of 2026 as ``time.time()`` gives it: 17 significant digits, 7 decimals.
NOW = 1796405433.9899783


def test_times_are_written_to_the_microsecond() -> None:
    run = RunRecord(last_run_at=NOW, last_outcome=Outcome.COMPLETED, last_task_id="t" * 36,
                    runs=1, running_since=NOW + 0.1, running_until=NOW + 60, failing_since=NOW,
                    since=NOW - 1)
    deferral = Deferral(lane="a", reason=DeferralReason.LEASE_HELD, blocker="b", since=NOW,
                        blocker_since=NOW + 1)
    sched = SchedRecord(inflight_task_id="t" * 36, inflight_deadline=NOW + 60,
                        last_dispatch_at=NOW - 1, dispatches=1, deferral=deferral)
    for record in (run, sched):
        data = json.loads(encode(record))
        times = [v for v in (*data.values(), *data.get("deferral", {}).values())
                 if isinstance(v, float)]
        assert len(times) == {RunRecord: 5, SchedRecord: 4}[type(record)]
        assert all(len(repr(t).split(".")[1]) <= 6 for t in times), times
        back = decode(type(record), encode(record), "k")
        assert encode(back) == encode(record)  # a record read and written again is unchanged
        for name in ("last_run_at", "running_until", "inflight_deadline", "last_dispatch_at"):
            if hasattr(record, name):
                assert abs(getattr(back, name) - getattr(record, name)) < 5e-7


def test_a_sched_record_of_the_bench_fits_the_160_byte_class() -> None:
    """A dispatch record (task id, deadline, dispatch time, count): 155 bytes, 159 with Redis's
    string header and terminator; with 7-decimal times it was 157 (the 192-byte class)."""
    sched = SchedRecord(inflight_task_id="e86a6435-1b49-4cb4-b16e-586b051b7687",
                        inflight_deadline=NOW + 60, last_dispatch_at=NOW - 1, dispatches=1)
    assert len(encode(sched)) + 4 <= 160


def test_a_missed_fire_time_is_kept_exactly() -> None:
    """``missed_through`` is compared with the schedule's fire times (the next fire strictly
    after it counts next): rounded down, a one-off's fire would be counted twice."""
    fire = 1796405433.1234565
    assert round(fire, 6) < fire
    back = decode(SchedRecord, encode(SchedRecord(missed_through=fire, missed=1)), "k")
    assert back.missed_through == fire
    assert schedules.missed_fires(schedules.OneOffFireTimes(fire), None, back.missed_through,
                                  fire + 3600, 60.0) is None


# -- the compact format (version 2, SCHEDPROJ_COMPACT_RECORDS; issue 23: Redis bytes) --------

#: A family member's records as the million bench writes them (a uuid task id, 2026 times).
BENCH_RUN = RunRecord(last_run_at=NOW, last_outcome=Outcome.COMPLETED,
                      last_task_id="e86a6435-1b49-4cb4-b16e-586b051b7687", runs=1)
BENCH_SCHED = SchedRecord(inflight_task_id="e86a6435-1b49-4cb4-b16e-586b051b7687",
                          inflight_deadline=NOW + 60, last_dispatch_at=NOW - 1, dispatches=1)


@pytest.mark.parametrize("record", [RunRecord(), SchedRecord(), FULL_RUN, FULL_SCHED,
                                    BENCH_RUN, BENCH_SCHED, RunRecord(since=3.0, runs=2),
                                    SchedRecord(missed_through=1796405433.1234565, missed=0)])
def test_both_formats_round_trip_to_the_same_record(record: Any) -> None:
    long, compact = encode(record), encode(record, compact=True)
    assert json.loads(long)["v"] == records.LONG_FORMAT == STATE_VERSION
    assert json.loads(compact)["v"] == records.COMPACT_FORMAT
    assert decode(type(record), long, "k") == decode(type(record), compact, "k")
    assert records.decode_with_format(type(record), compact, "k")[0] == records.COMPACT_FORMAT
    # Re-encoded from what was read, in either format, the text is the same.
    back = decode(type(record), compact, "k")
    assert (encode(back), encode(back, compact=True)) == (encode(record),
                                                          encode(record, compact=True))


def test_the_compact_format_names_each_field_by_its_short_key() -> None:
    """The same fields as the long format (those holding their default left out), each under
    its key from the fixed table; a deferral keeps its own field names."""
    for record in (FULL_RUN, FULL_SCHED, BENCH_RUN, BENCH_SCHED):
        short = records.SHORT_NAMES[type(record)]
        long, compact = json.loads(encode(record)), json.loads(encode(record, compact=True))
        assert compact == {"v": 2, **{short[name]: value for name, value in long.items()
                                      if name != "v"}}
    assert json.loads(encode(FULL_SCHED, compact=True))["df"]["blocker"] == "b"


def test_the_short_key_table_is_complete_and_unambiguous() -> None:
    """Every field has one key, no two fields of a record share one, and no field name is in
    both records (lua/record_format.lua keeps them in one table: tests/store check it equal)."""
    for cls, table in records.SHORT_NAMES.items():
        assert list(table) == [f.name for f in dataclasses.fields(cls)]
        assert len(set(table.values())) == len(table)
        assert all(1 <= len(key) <= 2 for key in table.values())
    assert not set(records.SHORT_NAMES[RunRecord]) & set(records.SHORT_NAMES[SchedRecord])


def test_the_bench_records_fall_to_the_112_byte_class_when_compact() -> None:
    """Redis keeps a field's value as an sds string (3 bytes of header, 1 of terminator) in a
    jemalloc class: 129 and 155 bytes take 160 each, 94 and 100 take 112 (32 bytes less
    twice)."""
    for record in (BENCH_RUN, BENCH_SCHED):
        assert 124 < len(encode(record)) + 4 <= 160
        assert len(encode(record, compact=True)) + 4 <= 112


def test_a_lease_ignores_the_compact_setting() -> None:
    """Only the run and sched records have a compact format; the lease stays version 1."""
    assert encode(FULL_LEASE, compact=True) == encode(FULL_LEASE)


def test_a_compact_record_with_a_long_field_name_is_refused() -> None:
    """Each format knows only its own names: a record mixing them is garbage, not a guess."""
    mixed = '{"v":2,"t":1.5,"runs":1}'
    with pytest.raises(StateError, match=r"unknown fields \['runs'\]"):
        decode(RunRecord, mixed, "lanes field 'L|run'")
    with pytest.raises(StateError, match=r"unknown fields \['t'\]"):
        decode(RunRecord, '{"v":1,"t":1.5}', "lanes field 'L|run'")
    with pytest.raises(StateError, match="must be a number"):
        decode(RunRecord, '{"v":2,"n":"one"}', "lanes field 'L|run'")


def test_the_previous_release_meets_a_compact_record_with_a_version_error() -> None:
    """A release before the compact format reads version 1 only (``codec.loads(raw, key, 1)``,
    as its ``decode`` did): a compact record is refused naming its key, never misread. This
    release's codec also says a newer release wrote it and what fixes it."""
    key = "schedproj:lanes field 'fam:acme|run'"
    with pytest.raises(StateError) as caught:
        codec.loads(encode(BENCH_RUN, compact=True), key, STATE_VERSION)
    message = str(caught.value)
    assert key in message and "format version 2, this schedproj reads version 1" in message
    assert "a newer schedproj wrote it" in message and "run a matching schedproj" in message
    with pytest.raises(StateError, match="format version 3, this schedproj reads version 1 or 2"):
        decode(RunRecord, '{"v":3}', key)


# -- decoding without ``__init__`` (a tick after a bulk add decodes every member's record) -------

#: Values of every JSON type, right and wrong for each field.
ANY_VALUE = (st.none() | st.booleans() | st.integers(-3, 2**40) | st.floats(-1e12, 1e12)
             | st.text(max_size=3) | st.sampled_from(["completed", "lost"])
             | st.lists(st.integers(), max_size=1))


def _outcome(cls: Any, raw: str) -> Any:
    """A record and its fields in order, or the refusal."""
    try:
        record = decode(cls, raw, "k")
    except StateError as exc:
        return exc.problem
    return record, list(vars(record).items())


@settings(max_examples=300)
@given(cls=st.sampled_from([RunRecord, SchedRecord]), data=st.data(),
       compact=st.booleans())
def test_a_record_decodes_as_init_and_a_check_of_every_field_decoded_it(
        cls: Any, data: Any, compact: bool) -> None:
    names = [f.name for f in dataclasses.fields(cls) if f.name != "deferral"]
    stored_fields = data.draw(st.dictionaries(st.sampled_from(names), ANY_VALUE))
    if compact:
        raw = json.dumps({"v": 2, **{records.SHORT_NAMES[cls][n]: v
                                     for n, v in stored_fields.items()}})
    else:
        raw = json.dumps({"v": STATE_VERSION, **stored_fields})
    fast = _outcome(cls, raw)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(records, "_BLANK", {})  # every record through __init__ and the full check
        slow = _outcome(cls, raw)
    assert fast == slow
    if not isinstance(fast, str):
        assert encode(fast[0]) == encode(slow[0])


@pytest.mark.parametrize("record", [RunRecord(), SchedRecord(), FULL_RUN, FULL_SCHED])
def test_a_decoded_record_is_built_as_init_builds_it(record: Any) -> None:
    decoded = decode(type(record), encode(record), "k")
    assert list(vars(decoded).items()) == list(vars(record).items())
    assert hash(decoded) == hash(record) and repr(decoded) == repr(record)
    with pytest.raises(dataclasses.FrozenInstanceError):
        decoded.runs = 1


def test_a_state_built_fast_is_the_one_init_builds() -> None:
    fast = new_state(FULL_RUN, FULL_SCHED)
    assert fast == LaneState(run=FULL_RUN, sched=FULL_SCHED)
    assert list(vars(fast).items()) == list(vars(LaneState(FULL_RUN, FULL_SCHED)).items())


def test_only_records_whose_every_default_is_plain_skip_init() -> None:
    assert set(records._BLANK) == {RunRecord, SchedRecord}
    assert list(records._BLANK[RunRecord].items()) == list(vars(RunRecord()).items())
    assert list(records._BLANK[SchedRecord].items()) == list(vars(SchedRecord()).items())
