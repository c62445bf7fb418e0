"""Lane families (core/families.py): member names and keys, the declaration's checks, each
member's spread due ratio, and the status fold of a family's members."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schedproj.core.errors import LaneDeclarationError, SchedprojError
from schedproj.core.families import (
    KEY_CHARS,
    KEY_MAX_LEN,
    FamilyError,
    LaneFamily,
    check_key,
    fold,
    jitter_unit,
    member_lane,
    member_spec,
    split_member,
)
from schedproj.core.lanes import DeploymentClass, Gate, Lane, LaneKind, LaneSpec, fixed_unit
from schedproj.core.laneset import build_lane_set
from schedproj.core.pools import Pool


def test_a_member_lane_is_named_family_bracket_key_and_splits_back() -> None:
    assert member_lane("sync", "acme/web") == "sync[acme/web]"
    assert split_member("sync[acme/web]") == ("sync", "acme/web")
    assert split_member("sync[a[b]") == ("sync", "a[b")


@pytest.mark.parametrize("name", ["sync", "sync[]", "[key]", "sync[key", "synckey]", "]"])
def test_names_that_are_no_member_do_not_split(name: str) -> None:
    assert split_member(name) is None


@pytest.mark.parametrize("key", ["a", "acme/web", "x.y_z-1:2@h+=", "A" * KEY_MAX_LEN])
def test_valid_keys_are_returned(key: str) -> None:
    assert check_key("fam", key) == key


@pytest.mark.parametrize(
    ("key", "problem"),
    [("", "is empty or not text"), (7, "is empty or not text"), (None, "is empty or not text"),
     ("A" * (KEY_MAX_LEN + 1), f"is {KEY_MAX_LEN + 1} characters long"),
     ("a b", "outside the allowed set: ' '"), ("a*?[", "outside the allowed set: '*?['"),
     ("é", "outside the allowed set: 'é'")],
)
def test_bad_keys_are_refused_naming_the_family_and_the_rule(key: Any, problem: str) -> None:
    with pytest.raises(FamilyError) as caught:
        check_key("fam", key)
    assert caught.value.thing == "family 'fam'"
    assert problem in caught.value.problem
    assert caught.value.fix.startswith("use ")
    assert str(KEY_MAX_LEN) in caught.value.fix or "letters, digits" in caught.value.fix
    assert str(caught.value).startswith("family 'fam': ") and "Fix: " in str(caught.value)
    assert isinstance(caught.value, SchedprojError)


def test_a_long_key_is_shown_cut_short() -> None:
    with pytest.raises(FamilyError) as caught:
        check_key("fam", "B" * 40 + "C" * 200)
    assert "C" not in caught.value.problem
    assert caught.value.fix == (f"use at most {KEY_MAX_LEN} characters (a hash of a longer "
                                "identifier, say)")


def test_an_empty_key_or_bad_characters_say_which_characters_to_use() -> None:
    for key in ("", "a b"):
        with pytest.raises(FamilyError) as caught:
            check_key("fam", key)
        assert KEY_CHARS in caught.value.fix


def test_a_valid_family_declaration_passes() -> None:
    LaneFamily(cadence_s=60, jitter=0.5, members=lambda: ["a"], members_sync_s=0.1).check("f")
    LaneFamily(cadence_s=60, jitter=0).check("f")


JITTER_FIX = "pass jitter=0.2 for ±20 % (or leave it out)"


@pytest.mark.parametrize(
    ("kw", "problem", "fix"),
    [({"jitter": -0.01}, "jitter must be between 0 and 0.5, got -0.01", JITTER_FIX),
     ({"jitter": 0.51}, "jitter must be between 0 and 0.5, got 0.51", JITTER_FIX),
     ({"jitter": math.nan}, "jitter must be between 0 and 0.5, got nan", JITTER_FIX),
     ({"jitter": True}, "jitter must be between 0 and 0.5, got True", JITTER_FIX),
     ({"jitter": "0.2"}, "jitter must be between 0 and 0.5, got '0.2'", JITTER_FIX),
     ({"priority0": True}, "priority0 is set on a family",
      "priority-0 is for one data-safety lane; declare it as a Lane"),
     ({"members": ["a"]}, "members is not callable", "pass a function returning the member keys"),
     ({"members_sync_s": 0}, "members_sync_s must be > 0, got 0", "pass a number of seconds"),
     ({"members_sync_s": "60"}, "members_sync_s must be > 0, got '60'",
      "pass a number of seconds")],
)
def test_a_bad_family_declaration_is_refused_saying_what_and_the_fix(
        kw: dict[str, Any], problem: str, fix: str) -> None:
    with pytest.raises(FamilyError) as caught:
        LaneFamily(cadence_s=60, **kw).check("f")
    assert (caught.value.thing, caught.value.problem, caught.value.fix) == (
        "family 'f'", problem, fix)
    assert str(caught.value) == f"family 'f': {problem}. Fix: {fix}"


def test_a_family_is_checked_as_a_lane_too_under_its_own_name() -> None:
    with pytest.raises(LaneDeclarationError, match="cadence_s is missing") as caught:
        LaneFamily().check("f")
    assert caught.value.lane == "f"


FAMILY = LaneSpec(name="fam", task_name="t.fam", kind=LaneKind.LIGHT, cadence_s=60,
                  family="fam")


def test_a_member_spec_is_the_familys_named_for_the_key_with_a_fixed_due_ratio() -> None:
    member = member_spec(FAMILY, 0.2, "acme")
    unit = jitter_unit("fam", "acme")
    assert unit == fixed_unit("fam[acme]")
    assert member.name == "fam[acme]" and member.family == "fam"
    assert member.task_name == "t.fam" and member.cadence_s == 60
    assert member.due_ratio == pytest.approx(1.0 + 0.2 * (2.0 * unit - 1.0))
    assert member_spec(FAMILY, 0.0, "acme").due_ratio == 1.0


def replaced(family: LaneSpec, jitter: float, key: str) -> LaneSpec:
    """What ``member_spec`` built with ``dataclasses.replace`` before it filled the record's
    ``__dict__`` (``frozen.evolve``): the spec it builds must stay this one."""
    name = member_lane(family.name, key)
    return dataclasses.replace(family, name=name, family=family.name,
                               due_ratio=1.0 + jitter * (2.0 * fixed_unit(name) - 1.0))


def same_spec(fast: LaneSpec, slow: LaneSpec) -> None:
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert list(vars(fast).items()) == list(vars(slow).items())  # same fields, same order
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.name = "x"  # type: ignore[misc]


KEYS = st.text("abcXYZ019._:/@+=-", min_size=1, max_size=20)


@given(jitter=st.floats(0, 0.5), key=KEYS, heavy=st.booleans(), calendar=st.booleans(),
       gates=st.lists(st.sampled_from(["t.free", "t.other"]), unique=True, max_size=2),
       pool=st.sampled_from([None, "gpu"]), slots=st.integers(1, 2),
       weight=st.floats(0.5, 3), order=st.integers(0, 2000),
       retry=st.sampled_from([None, 30.0]), local=st.booleans())
def test_a_member_spec_is_what_replace_builds_for_any_declared_family(
        jitter: float, key: str, heavy: bool, calendar: bool, gates: list[str],
        pool: str | None, slots: int, weight: float, order: int, retry: float | None,
        local: bool) -> None:
    family = LaneFamily(
        cadence_s=None if calendar else 60, schedule="30 2 * * *" if calendar else None,
        catchup_window_s=600 if calendar else None,
        kind=LaneKind.HEAVY if heavy else LaneKind.LIGHT, jitter=jitter,
        gates=tuple(Gate(g, max_defer_s=9) for g in gates), order=order,
        weight=weight if heavy else 1.0, pool=pool if heavy else None,
        slots=slots if heavy and pool else 1,
        retry_after_failure_s=retry, retry_window_s=retry and 4 * retry,
        deployment=DeploymentClass.LOCAL_ONLY if local else DeploymentClass.SHARED)
    lanes = build_lane_set({"t.fam": SimpleNamespace(lane=family, queue=None),
                            "t.free": SimpleNamespace(lane=Lane(cadence_s=60, kind="light"),
                                                      queue=None),
                            "t.other": SimpleNamespace(lane=Lane(cadence_s=90, kind="light"),
                                                       queue=None)},
                           pools=[Pool("gpu", slots=2)])
    template = lanes.families["t.fam"]
    same_spec(member_spec(template, jitter, key), replaced(template, jitter, key))
    same_spec(lanes.spec(f"t.fam[{key}]"), replaced(template, jitter, key))
    assert lanes.find(f"t.fam[{key}]") == lanes.spec(f"t.fam[{key}]")


@given(family=st.builds(
    LaneSpec, name=st.sampled_from(["fam", "a.b"]), task_name=st.just("t.fam"),
    kind=st.sampled_from(LaneKind), cadence_s=st.floats(1, 1e6),
    priority0=st.booleans(), gates=st.just((Gate("t.x"),)) | st.just(()),
    family=st.sampled_from([None, "fam"]), due_ratio=st.floats(0.5, 1.5),
    retry_after_failure_s=st.none() | st.floats(1, 100),
    catchup_window_s=st.none() | st.floats(1, 100), slots=st.integers(1, 4)),
    jitter=st.floats(0, 0.5), key=KEYS)
def test_a_member_spec_is_what_replace_builds_for_any_spec(family: LaneSpec, jitter: float,
                                                            key: str) -> None:
    same_spec(member_spec(family, jitter, key), replaced(family, jitter, key))


def test_member_due_ratios_spread_across_one_plus_minus_jitter() -> None:
    ratios = [member_spec(FAMILY, 0.3, f"k{i}").due_ratio for i in range(300)]
    assert all(0.7 <= r < 1.3 for r in ratios)
    assert min(ratios) < 0.75 and max(ratios) > 1.25
    assert sum(r < 1.0 for r in ratios) > 100 and sum(r > 1.0 for r in ratios) > 100


def row(name: str, ratio: float, *, due: bool = False, in_flight: bool = False,
        deferral_reason: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(name=name, ratio=ratio, due=due, in_flight=in_flight,
                           deferral_reason=deferral_reason)


def test_fold_counts_each_member_once_by_its_state_and_finds_the_worst() -> None:
    rows = [row("f[a]", 0.5), row("f[b]", 3.0, due=True),
            row("f[c]", 2.0, due=True, deferral_reason="dependency-backpressure"),
            row("f[d]", 4.0, due=True, in_flight=True, deferral_reason="x"),
            row("f[e]", 1.0, in_flight=True), row("f[f]", 4.0, due=True),
            row("f[g]", 0.1, due=True, deferral_reason="heavy-maintenance-lease-held")]
    stats = fold("f", "light", 7, rows)
    assert (stats.family, stats.kind, stats.members) == ("f", "light", 7)
    assert (stats.due, stats.deferred, stats.running) == (2, 2, 2)
    assert (stats.max_ratio, stats.worst) == (4.0, "f[d]")


def test_fold_of_no_members_has_no_worst() -> None:
    stats = fold("f", "heavy", 0, [])
    assert (stats.due, stats.deferred, stats.running, stats.max_ratio, stats.worst) == (
        0, 0, 0, 0.0, None)


def test_fold_names_a_member_even_when_every_ratio_is_zero() -> None:
    assert fold("f", "heavy", 2, [row("f[a]", 0.0), row("f[b]", 0.0)]).worst == "f[a]"
