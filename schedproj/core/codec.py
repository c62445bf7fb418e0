"""The one versioned JSON codec for every value schedproj stores (lane records, the lease, the
published lane set, the watchdog latch, the REM store's records). Pure.

A stored value is a JSON object carrying its format version under ``"v"``; anything else — not
JSON, not an object, another version, a non-finite number (``NaN``, ``Infinity``, or a literal
too large for a float, which Python's ``json`` would accept, integers included) — is a
:class:`StateError` naming the key, so garbage is reported and left alone instead of crashing or
spinning a loop.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from schedproj.core.errors import StateError

#: The key under which every stored object carries its format version.
VERSION_FIELD = "v"


#: The compact encoders :func:`dumps` uses, by ``sort_keys`` (``json.dumps`` with separators
#: built one per call: a beat's first start encodes a state for every entry).
_ENCODERS = {sort: json.JSONEncoder(separators=(",", ":"), sort_keys=sort)
             for sort in (False, True)}


def dumps(payload: Mapping[str, Any], version: int, *, sort_keys: bool = False) -> str:
    """Serialize ``payload`` as compact JSON with its format version first."""
    return _ENCODERS[bool(sort_keys)].encode({VERSION_FIELD: version, **payload})


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name} is not allowed")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is out of range (not finite)")
    return value


def _too_large_for_float(value: Any) -> bool:
    if isinstance(value, list):
        return any(_too_large_for_float(item) for item in value)
    if isinstance(value, int):
        try:
            float(value)
        except OverflowError:
            return True
    return False


def _refuse_huge_integers(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # JSON integers have no size limit and Python reads them exactly, but every time in a record
    # meets float arithmetic (``last_run_at + cadence``): one beyond a float's range would raise
    # OverflowError there, in the tick, instead of being reported here as bad state. Only ints
    # and lists are looked into (a value of another type cannot hold one outside an object,
    # and an object's own fields came through here): a beat taking over decodes every entry's
    # state, and a call per field was a fifth of the decode.
    for name, value in pairs:
        kind = type(value)
        if (kind is int or kind is list) and _too_large_for_float(value):
            raise ValueError(f"field {name!r} holds an integer too large for a float")
    return dict(pairs)


#: One decoder for every value (``json.loads`` with these hooks built a new one per call: a
#: tenth of a decode).
_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float,
                            object_pairs_hook=_refuse_huge_integers)


def loads(raw: str | bytes, key: str, version: int) -> dict[str, Any]:
    """Parse a stored object of format ``version``; the version field is removed.

    Raises :class:`StateError` naming ``key`` when the value is not JSON (non-finite numbers
    included; an integer beyond a float's range also names its field), not an object, or of
    another version.
    """
    return loads_versioned(raw, key, (version,))[1]


def loads_versioned(raw: str | bytes, key: str, versions: tuple[int, ...]
                    ) -> tuple[int, dict[str, Any]]:
    """Parse a stored object of any of the format ``versions``: (its version, its fields
    without the version field). The same refusals as :func:`loads`; a version newer than any
    known says so, and what fixes it."""
    try:
        text = raw if isinstance(raw, str) else raw.decode(json.detect_encoding(raw),
                                                           "surrogatepass")   # as json.loads
        data = _DECODER.decode(text)
    except (TypeError, ValueError, UnicodeDecodeError) as exc:
        raise StateError(key, f"not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise StateError(key, f"expected a JSON object, found {type(data).__name__}")
    found = data.pop(VERSION_FIELD, None)
    if found not in versions:
        known = " or ".join(str(v) for v in versions)
        newer = (" (a newer schedproj wrote it: run that release here, or have that release "
                 "rewrite it in a format this one reads)"
                 if type(found) is int and found > max(versions) else "")
        raise StateError(key, f"format version {found!r}, this schedproj reads version "
                              f"{known}{newer}")
    return found, data


__all__ = ["VERSION_FIELD", "dumps", "loads", "loads_versioned"]
