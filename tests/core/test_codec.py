"""The versioned JSON codec: what it writes, and every kind of garbage it refuses as a
StateError naming the key (DESIGN §3 promise 8: garbage in Redis is reported, not a crash)."""

from __future__ import annotations

import pytest

from schedproj.core import codec
from schedproj.core.defaults import STATE_VERSION
from schedproj.core.errors import StateError
from schedproj.core.records import RunRecord, SchedRecord, decode

HUGE = "1" + "0" * 400  # a JSON integer no float can hold


def stored(field: str, value_text: str, version: int = STATE_VERSION) -> str:
    """A stored object whose ``field`` holds the JSON text ``value_text`` as written."""
    return f'{{"v":{version},"{field}":{value_text}}}'


def test_dumps_is_compact_json_with_the_version_first() -> None:
    text = codec.dumps({"b": 1, "a": [1, 2]}, 7)
    assert text == '{"v":7,"b":1,"a":[1,2]}'
    assert codec.dumps({"b": 1, "a": 2}, 3, sort_keys=True) == '{"a":2,"b":1,"v":3}'


def test_loads_gives_back_the_payload_without_its_version() -> None:
    for raw in (codec.dumps({"x": 1.5, "y": None, "z": "s"}, 4),
                codec.dumps({"x": 1.5, "y": None, "z": "s"}, 4).encode()):
        assert codec.loads(raw, "k", 4) == {"x": 1.5, "y": None, "z": "s"}


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ('{"v":1,', "not valid JSON"),
        (b'\xff\xfe', "not valid JSON"),
        ('{"v":1,"t":NaN}', "non-finite number NaN is not allowed"),
        ('{"v":1,"t":Infinity}', "non-finite number Infinity is not allowed"),
        ('{"v":1,"t":-Infinity}', "non-finite number -Infinity is not allowed"),
        ('{"v":1,"t":1e400}', "number 1e400 is out of range (not finite)"),
        ('[1, 2]', "expected a JSON object, found list"),
        ('"text"', "expected a JSON object, found str"),
        ('{"t":1}', "format version None"),
        ('{"v":2,"t":1}', "format version 2"),
    ],
)
def test_garbage_is_a_state_error_naming_the_key(raw: str | bytes, problem: str) -> None:
    with pytest.raises(StateError) as caught:
        codec.loads(raw, "lanes:state", 1)
    assert caught.value.key == "lanes:state"
    assert problem in caught.value.problem
    assert "'lanes:state'" in str(caught.value)


def test_the_version_mismatch_says_which_version_this_schedproj_reads() -> None:
    with pytest.raises(StateError, match="this schedproj reads version 5"):
        codec.loads('{"v":4}', "k", 5)


@pytest.mark.parametrize("field", ["last_run_at", "inflight_deadline"])
def test_an_integer_too_large_for_a_float_is_refused_naming_its_field(field: str) -> None:
    # Issue 19 item 3: such an integer reached views.effective_last_run and its float
    # arithmetic raised OverflowError, which stopped beat.
    with pytest.raises(StateError) as caught:
        codec.loads(stored(field, HUGE), "lanes:state", STATE_VERSION)
    assert caught.value.key == "lanes:state"
    assert repr(field) in caught.value.problem
    assert "too large for a float" in caught.value.problem


def test_a_huge_integer_is_refused_negative_nested_or_in_a_list() -> None:
    for value in ("-" + HUGE, f"[1, {HUGE}]", f'{{"since": {HUGE}}}', f"[[{HUGE}]]"):
        with pytest.raises(StateError, match="too large for a float"):
            codec.loads(stored("deferral", value, 1), "k", 1)


def test_a_large_integer_a_float_can_hold_is_kept_exactly() -> None:
    big = 10**300
    assert codec.loads(stored("n", str(big), 1), "k", 1) == {"n": big}
    assert codec.loads(stored("l", f"[{big}, true]", 1), "k", 1) == {"l": [big, True]}


def test_a_lane_record_with_a_huge_time_is_reported_not_decoded() -> None:
    with pytest.raises(StateError, match="last_run_at"):
        decode(RunRecord, stored("last_run_at", HUGE), "lanes:a|run")
    with pytest.raises(StateError, match="inflight_deadline"):
        decode(SchedRecord, stored("inflight_deadline", HUGE), "lanes:a|sched")
