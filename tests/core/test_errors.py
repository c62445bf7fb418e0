"""The one exception hierarchy (``core.errors``): every error is a SchedprojError, and the
messages name the thing and the fix (DESIGN.md promise 8)."""

from __future__ import annotations

import pytest

from schedproj.core.errors import (
    BeatLockLost,
    ConfigurationError,
    LaneDeclarationError,
    LeaseLost,
    SchedprojError,
    StateError,
)


@pytest.mark.parametrize("kind", [ConfigurationError, LaneDeclarationError, StateError,
                                  LeaseLost, BeatLockLost])
def test_every_error_is_a_schedproj_error(kind: type[Exception]) -> None:
    assert issubclass(kind, SchedprojError)


def test_a_bad_lane_declaration_is_a_configuration_error_naming_lane_problem_and_fix() -> None:
    err = LaneDeclarationError("summary", "cadence_s must be > 0", "give cadence_s=600")
    assert isinstance(err, ConfigurationError)
    assert (err.lane, err.problem, err.fix) == ("summary", "cadence_s must be > 0",
                                                "give cadence_s=600")
    assert str(err) == "lane 'summary': cadence_s must be > 0. Fix: give cadence_s=600"


def test_a_state_error_names_the_key_says_it_was_left_and_how_to_clear_it() -> None:
    err = StateError("schedproj:lane:x|run", "not JSON")
    assert (err.key, err.problem) == ("schedproj:lane:x|run", "not JSON")
    text = str(err)
    assert text.startswith("state at Redis key 'schedproj:lane:x|run': not JSON. ")
    assert "left untouched" in text and "delete it" in text
    assert not isinstance(err, ConfigurationError)
