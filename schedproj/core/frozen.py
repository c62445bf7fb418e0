"""Frozen records built without their dataclass ``__init__``, for a tick's hot path. Pure.

A frozen dataclass's ``__init__`` sets every field through ``object.__setattr__`` (it must get
past the class's own ``__setattr__``, which refuses), and ``dataclasses.replace`` adds a walk
over ``fields()`` on top: about 1 µs and 3 µs a record. A tick of a few lanes builds a dozen
records (views, deferrals, changed sched records), so those calls were a fifth of the
simulator's time and a fixed cost of every beat tick. :func:`evolve` fills the new record's
``__dict__`` directly (in field order: ``records.encode`` writes the dict as it is), which is
what ``__init__`` leaves behind for a *plain* record: a dataclass whose ``__init__`` sets every
field and does nothing else (no ``__post_init__``, no slots). Any other class gets
``dataclasses.replace``: the shortcut never skips a check.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass, replace
from typing import Any, TypeVar

T = TypeVar("T")

_new = object.__new__
#: Classes checked plain (True) or not (False), once each.
_PLAIN: dict[type, bool] = {}


def is_plain(cls: type) -> bool:
    """May ``cls``'s records be built by filling their ``__dict__``? A dataclass whose fields
    are all set by ``__init__``, with no ``__post_init__`` and a ``__dict__`` (no slots)."""
    known = _PLAIN.get(cls)
    if known is None:
        known = _PLAIN[cls] = (
            is_dataclass(cls) and not hasattr(cls, "__post_init__")
            and not hasattr(cls, "__slots__") and all(f.init for f in fields(cls)))
    return known


def evolve(record: T, /, **changes: Any) -> T:
    """``dataclasses.replace(record, **changes)`` for a plain record (:func:`is_plain`), about
    a sixth of its cost: the fields copied in order, ``changes`` (which must name fields) set.
    A record of another class goes through ``replace``. Also a fast constructor: evolve a
    class's record of defaults with every field given."""
    cls = type(record)
    if not (_PLAIN.get(cls) or is_plain(cls)):
        return replace(record, **changes)  # type: ignore[type-var]
    new = _new(cls)
    d = new.__dict__
    d.update(record.__dict__)
    d.update(changes)
    return new


__all__ = ["evolve", "is_plain"]
