"""What the operator tools accept from Redis: numbers a float holds, records of the right shape.

Anyone with access to Redis can write anything into any key. The tools (status, the page,
``/metrics``, the watchdog) read every key, so a value they cannot use is reported — naming the
key and the fix — and left out, never a crash, an empty reply or a traceback.
"""

from __future__ import annotations

import math
import re
from dataclasses import fields, is_dataclass
from typing import Any

#: Larger magnitudes are no time, count or fence schedproj ever writes (a float holds every
#: integer up to 2**53 exactly); beyond it a value overflows floats, Prometheus and dates.
SANE_MAGNITUDE = float(2 ** 53)
#: A decimal number as schedproj writes it: ASCII digits only (``str.isdigit`` also takes
#: ``²`` and other digits ``int()`` refuses).
_DECIMAL = re.compile(r"-?[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?")
_INTEGER = re.compile(r"-?[0-9]{1,16}")


def as_number(value: Any) -> float | None:
    """``value`` (a number, or its decimal text) as a finite float of sane magnitude; None
    when it is anything else (NaN, a huge integer, ``"yesterday"``, a bool)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        if not _DECIMAL.fullmatch(value.strip()):
            return None
        value = value.strip()
    elif not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except (OverflowError, ValueError):
        return None
    return number if math.isfinite(number) and abs(number) <= SANE_MAGNITUDE else None


def as_count(value: Any) -> int | None:
    """A counter's value (an integer, or its ASCII decimal text) of sane magnitude, or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if abs(value) <= SANE_MAGNITUDE else None
    if isinstance(value, str) and _INTEGER.fullmatch(value.strip()):
        return int(value.strip())
    return None


def shown(value: Any, limit: int = 40) -> str:
    """A value for a problem line: its repr, cut short (a 10 MB value is not echoed)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def bad_field(record: Any) -> str | None:
    """The first field of a dataclass record (nested records and tuples of them included)
    whose value a tool cannot use: a number out of range or of the wrong type, text that is
    not text. None when every field is usable."""
    if not is_dataclass(record):
        return None
    for f in fields(record):
        value = getattr(record, f.name)
        kind = str(f.type)
        if value is None:
            continue
        if is_dataclass(value) or isinstance(value, tuple):
            inner = [bad_field(v) for v in (value if isinstance(value, tuple) else (value,))]
            problem = next((p for p in inner if p), None)
            if problem:
                return f"{f.name}.{problem}"
        elif kind.startswith(("float", "int")) and as_number(value) is None:
            return f"{f.name} = {shown(value)} (not a number in range)"
        elif kind.startswith("str") and not isinstance(value, str):
            return f"{f.name} = {shown(value)} (not text)"
        elif kind == "bool" and not isinstance(value, bool):
            return f"{f.name} = {shown(value)} (not true or false)"
    return None


#: The watchdog latch's fields a tool reads, and what each must be.
_WATCHDOG_SHAPE: dict[str, tuple[type, ...]] = {
    "posture": (str,), "stalled": (bool,), "reasons": (list,), "assessed_at": (int, float),
}
_WATCHDOG_TIMES = ("assessed_at", "stall_since", "alarm_fired_at", "cleared_at")


def watchdog_problem(data: Any) -> str | None:
    """Why the watchdog latch (decoded JSON) cannot be shown, or None."""
    if not isinstance(data, dict):
        return f"not a JSON object ({type(data).__name__})"
    for name, kinds in _WATCHDOG_SHAPE.items():
        if name in data and not isinstance(data[name], kinds):
            return f"field {name} = {shown(data[name])} is of the wrong type"
    if not all(isinstance(r, str) for r in data.get("reasons", [])):
        return "field reasons holds something other than text"
    for name in _WATCHDOG_TIMES:
        if data.get(name) is not None and as_number(data[name]) is None:
            return f"field {name} = {shown(data[name])} is not a time"
    return None


__all__ = ["SANE_MAGNITUDE", "as_count", "as_number", "bad_field", "shown",
           "watchdog_problem"]
