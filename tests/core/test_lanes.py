"""Lane declarations (core/lanes.py): what a valid lane is, and that every bad declaration fails
at start naming the lane and the fix (DESIGN §3 promise 8)."""

from __future__ import annotations

import hashlib
import math
from typing import Any

import pytest

from schedproj.core import defaults
from schedproj.core.errors import LaneDeclarationError
from schedproj.core.lanes import (
    DeferralReason,
    DeploymentClass,
    DueCheckStamp,
    Gate,
    GateCondition,
    Lane,
    LaneKind,
    LaneSpec,
    Profile,
    enabled_under,
    fixed_unit,
    queue_for,
)


def refused(lane: Lane, name: str = "my.lane") -> LaneDeclarationError:
    with pytest.raises(LaneDeclarationError) as caught:
        lane.check(name)
    assert caught.value.lane == name
    assert f"lane {name!r}: " in str(caught.value) and "Fix: " in str(caught.value)
    return caught.value


def test_a_lane_takes_plain_strings_and_lists_and_stores_the_validated_forms() -> None:
    gate = Gate("a")
    lane = Lane(cadence_s=60, kind="light", deployment="local-only",  # type: ignore[arg-type]
                gates=[gate])  # type: ignore[arg-type]
    assert lane.kind is LaneKind.LIGHT
    assert lane.deployment is DeploymentClass.LOCAL_ONLY
    assert lane.gates == (gate,)
    assert Lane(cadence_s=60, gates=None).gates == ()  # type: ignore[arg-type]
    lane.check("ok")  # valid: no error


def test_defaults_of_a_lane_and_a_gate() -> None:
    lane = Lane(cadence_s=60)
    assert (lane.kind, lane.priority0, lane.deployment, lane.gates, lane.order,
            lane.backlog_driven, lane.due_check, lane.retry_after_failure_s,
            lane.retry_window_s, lane.name) == (
        LaneKind.HEAVY, False, DeploymentClass.SHARED, (), None, False, None, None, None, None)
    gate = Gate("a")
    assert (gate.when, gate.reason, gate.max_defer_s, gate.in_legacy) == (
        GateCondition.DUE_AND_BEHIND, DeferralReason.DEPENDENCY, None, False)


@pytest.mark.parametrize(("kw", "problem"), [
    ({"kind": "medium"}, "'medium' is not a valid LaneKind"),
    ({"deployment": "moon"}, "'moon' is not a valid DeploymentClass")])
def test_an_unknown_kind_or_deployment_names_the_choices(kw: dict[str, Any],
                                                         problem: str) -> None:
    with pytest.raises(LaneDeclarationError) as caught:
        Lane(cadence_s=60, name="x", **kw)
    assert (caught.value.lane, caught.value.problem) == ("x", problem)
    assert "'heavy'" in caught.value.fix and "'local-only'" in caught.value.fix
    with pytest.raises(LaneDeclarationError) as unnamed:
        Lane(cadence_s=60, **kw)
    assert unnamed.value.lane == "<unnamed>"


def test_gates_that_are_not_a_sequence_are_refused() -> None:
    with pytest.raises(LaneDeclarationError, match="gates must be a tuple of Gate") as caught:
        Lane(cadence_s=60, gates=Gate("a"), name="x")  # type: ignore[arg-type]
    assert caught.value.lane == "x"
    assert caught.value.fix == "pass gates=(Gate('blocker-lane'),) or leave it out"
    with pytest.raises(LaneDeclarationError) as unnamed:
        Lane(cadence_s=60, gates="a")  # type: ignore[arg-type]
    assert unnamed.value.lane == "<unnamed>"


CADENCE_FIX = "pass cadence_s=<seconds>, e.g. cadence_s=600 for ten minutes"
POSITIVE_FIX = "pass cadence_s=<seconds> greater than 0"


@pytest.mark.parametrize(
    ("cadence", "problem", "fix"),
    [(None, "cadence_s is missing", CADENCE_FIX),
     ("60", "cadence_s must be a number of seconds, got '60'", CADENCE_FIX),
     (True, "cadence_s must be a number of seconds, got True", CADENCE_FIX),
     (0, "cadence_s must be a positive finite number, got 0", POSITIVE_FIX),
     (-1.0, "cadence_s must be a positive finite number, got -1.0", POSITIVE_FIX),
     (math.inf, "cadence_s must be a positive finite number, got inf", POSITIVE_FIX),
     (math.nan, "cadence_s must be a positive finite number, got nan", POSITIVE_FIX)],
)
def test_a_bad_cadence_is_refused(cadence: Any, problem: str, fix: str) -> None:
    error = refused(Lane(cadence_s=cadence))
    assert (error.problem, error.fix) == (problem, fix)


@pytest.mark.parametrize("cadence", [1, 0.001, 86400.0])
def test_any_positive_finite_cadence_is_accepted(cadence: float) -> None:
    Lane(cadence_s=cadence).check("ok")


@pytest.mark.parametrize(
    ("after", "window"),
    [(900, None), (None, 900), (0, 900), (901, 900), (-5, 900), ("9", 900), (True, 900),
     (900, math.inf), (math.nan, 900)],
)
def test_retry_settings_that_do_not_fit_together_are_refused(after: Any, window: Any) -> None:
    error = refused(Lane(cadence_s=60, retry_after_failure_s=after, retry_window_s=window))
    assert error.problem == (f"retry_after_failure_s={after!r} and retry_window_s={window!r} "
                             "do not fit together")
    assert error.fix == ("set both, with 0 < retry_after_failure_s <= retry_window_s (e.g. 900 "
                         "and 3600: retry 15 min after a failure, for up to an hour)")


@pytest.mark.parametrize(("after", "window"), [(900, 900), (0.5, 3600), (900, 3600.0)])
def test_retry_settings_that_fit_are_accepted(after: float, window: float) -> None:
    Lane(cadence_s=60, retry_after_failure_s=after, retry_window_s=window).check("ok")


@pytest.mark.parametrize(
    ("kw", "problem", "fix"),
    [({"priority0": 1}, "priority0 must be True or False, got 1",
      "pass priority0=True or leave it out"),
     ({"backlog_driven": "yes"}, "backlog_driven must be True or False, got 'yes'",
      "pass backlog_driven=True or leave it out"),
     ({"priority0": True, "kind": LaneKind.LIGHT}, "priority0 is set on a light lane",
      "priority-0 only ranks heavy lanes; drop priority0 or make the lane heavy"),
     ({"order": 1.5}, "order must be an integer, got 1.5", "pass order=<int>"),
     ({"order": True}, "order must be an integer, got True", "pass order=<int>"),
     ({"due_check": 3}, "due_check is not callable", "pass a function returning the backlog")],
)
def test_bad_options_are_refused(kw: dict[str, Any], problem: str, fix: str) -> None:
    error = refused(Lane(cadence_s=60, **kw))
    assert (error.problem, error.fix) == (problem, fix)


def test_good_options_are_accepted() -> None:
    Lane(cadence_s=60, priority0=True, order=-3, backlog_driven=True,
         due_check=lambda: 0).check("ok")


BOUND_FIX = "pass a positive number of seconds or None"


@pytest.mark.parametrize(
    ("gate", "problem", "fix"),
    [("other", "gate 'other' is not a schedproj.Gate", "use Gate(blocker=...)"),
     (Gate("my.lane"), "a gate names the lane itself", "remove the self-referencing gate"),
     (Gate("a", max_defer_s=0), "gate on 'a' has max_defer_s=0", BOUND_FIX),
     (Gate("a", max_defer_s=-1), "gate on 'a' has max_defer_s=-1", BOUND_FIX)],
)
def test_bad_gates_are_refused(gate: Any, problem: str, fix: str) -> None:
    error = refused(Lane(cadence_s=60, gates=(Gate("ok"), gate)))
    assert (error.problem, error.fix) == (problem, fix)


def test_a_gate_with_a_positive_bound_is_accepted() -> None:
    Lane(cadence_s=60, gates=(Gate("a", max_defer_s=0.5), Gate("b"))).check("ok")


def test_a_gate_takes_strings_and_refuses_unknown_conditions() -> None:
    gate = Gate("a", when="due-or-running", reason="golden-path-dependency-backpressure")  # type: ignore[arg-type]
    assert gate.when is GateCondition.DUE_OR_RUNNING
    assert gate.reason is DeferralReason.GOLDEN_PATH_DEPENDENCY
    for kw in ({"when": "sometimes"}, {"reason": "because"}):
        with pytest.raises(LaneDeclarationError) as caught:
            Gate("a", **kw)  # type: ignore[arg-type]
        assert caught.value.lane == "gate on 'a'"
        assert "'due-or-running'" in caught.value.fix and "'dependency-backpressure'" in (
            caught.value.fix)


def test_a_spec_sorts_by_declared_order_then_name_and_knows_its_kind() -> None:
    spec = LaneSpec(name="b", task_name="t.b", kind=LaneKind.HEAVY, cadence_s=60, order=3)
    assert spec.sort_key == (3, "b")
    assert spec.heavy
    assert not LaneSpec(name="b", task_name="t.b", kind=LaneKind.LIGHT, cadence_s=60).heavy
    default = LaneSpec(name="b", task_name="t.b", kind=LaneKind.LIGHT, cadence_s=60)
    assert (default.order, default.due_ratio, default.family) == (1000, 1.0, None)


def test_only_the_cloud_profile_leaves_local_only_lanes_out() -> None:
    assert not enabled_under(Profile.CLOUD, DeploymentClass.LOCAL_ONLY)
    assert enabled_under(Profile.LOCAL, DeploymentClass.LOCAL_ONLY)
    for deployment in DeploymentClass:
        if deployment is not DeploymentClass.LOCAL_ONLY:
            assert enabled_under(Profile.CLOUD, deployment)
            assert enabled_under(Profile.LOCAL, deployment)


def test_heavy_and_light_lanes_go_to_their_own_queues() -> None:
    assert queue_for(LaneKind.HEAVY) == defaults.HEAVY_QUEUE
    assert queue_for(LaneKind.LIGHT) == defaults.LIGHT_QUEUE
    assert defaults.HEAVY_QUEUE != defaults.LIGHT_QUEUE


def test_fixed_unit_is_stable_spread_and_in_the_unit_interval() -> None:
    units = [fixed_unit(f"lane-{i}") for i in range(200)]
    assert all(0.0 <= u < 1.0 for u in units)
    assert units == [fixed_unit(f"lane-{i}") for i in range(200)]
    assert len(set(units)) == 200
    assert 0.35 < sum(units) / len(units) < 0.65
    assert min(units) < 0.1 and max(units) > 0.9
    digest = hashlib.blake2b(b"a", digest_size=8).digest()
    assert fixed_unit("a") == int.from_bytes(digest, "big") / 2.0**64


# -- a stamped due check (opt-in) --------------------------------------------------------------

def _pending() -> int:
    return 0


@pytest.mark.parametrize(("kw", "problem"), [
    ({"due_check_stamp": DueCheckStamp("app:stamp")}, "without a due_check"),
    ({"due_check": _pending, "due_check_stamp": "app:stamp"}, "must be a DueCheckStamp"),
    ({"due_check": _pending, "due_check_stamp": DueCheckStamp("")}, "non-empty key name"),
    ({"due_check": _pending, "due_check_stamp": DueCheckStamp("app:stamp", max_age_s=0)},
     "positive number of seconds"),
    ({"due_check": _pending, "due_check_stamp": DueCheckStamp("app:stamp",
                                                              max_age_s=math.inf)},
     "positive number of seconds"),
])
def test_a_bad_due_check_stamp_is_refused(kw: dict[str, Any], problem: str) -> None:
    with pytest.raises(LaneDeclarationError, match=problem):
        Lane(cadence_s=60, **kw).check("lane")


def test_a_due_check_is_unstamped_unless_its_lane_says_so() -> None:
    """A user's due check may read anything: beat calls it every tick unless the lane opts in."""
    assert Lane(cadence_s=60, due_check=_pending).due_check_stamp is None
    Lane(cadence_s=60, due_check=_pending, due_check_stamp=DueCheckStamp("app:stamp")).check("x")
