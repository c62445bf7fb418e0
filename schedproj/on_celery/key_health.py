"""Beat's side of broken keys: heal the derived ones, report the others, once per onset.

The due index and the changed set are derived from the lane records: beat rebuilds them when a
tick finds one broken (``store/lua/tick_read.lua`` says which), and re-checks the index a
slice a tick, a cycle begun every :data:`~schedproj.core.dueindex.DERIVED_RECONCILE_S`. Every
other key a tick reads is an operator's or another process's: one of the wrong type is read
as empty (``paused``, ``run-now``) or stops only what depends on it (``lease``: heavy lanes;
``lanes``: every lane; the beat fence: every dispatch), and is named with its fix until it is
fixed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import redis

from schedproj.store.lane_store import LaneStore
from schedproj.store.protocol import CounterKind, Keys, counter_field

logger = logging.getLogger("schedproj.beat")

#: What a broken operator key stops, by the key's name under the prefix.
STOPS = {
    "paused": "read as empty: paused lanes may run",
    "run-now": "read as empty: run-now requests wait",
    "lease": "heavy lanes wait (light lanes run)",
    "lanes": "no lane record can be read: nothing is dispatched",
    "beat:fence": "no message can be fenced: nothing is dispatched",
}


#: The Redis type each key beat reads or writes must have (``Keys`` attribute -> type).
KEY_TYPES = {
    "lanes": "hash", "lease": "string", "epoch": "string", "due": "zset", "changed": "set",
    "changed_reading": "set",
    "paused": "set", "run_now": "set", "beat_lock": "string", "beat_fence": "string",
    "due_stamp": "string", "changed_stamp": "string", "wake": "list", "pressure": "hash",
    "counters": "hash", "dispatch_log": "list", "journal": "list", "errors": "hash",
    "published_lanes": "string", "beat_info": "hash", "families": "set",
    "lease_fence": "string",
}


def wrong_typed(client: redis.Redis, keys: Keys) -> dict[str, str]:
    """Each key beat uses that holds another type than it must: key -> the type it must have.
    One round trip; asked only after Redis refused a command (its error names no key)."""
    names = {getattr(keys, attr): kind for attr, kind in KEY_TYPES.items()}
    pipe = client.pipeline(transaction=False)
    for key in names:
        pipe.type(key)
    found = pipe.execute()
    return {key: kind for (key, kind), got in zip(names.items(), found, strict=True)
            if str(got) not in (kind, "none")}


class KeyHealth:
    """Which keys the last tick found broken, so each onset is said once."""

    def __init__(self, store: LaneStore, keys: Keys) -> None:
        self.store, self.keys = store, keys
        self._said: dict[str, str] = {}

    def derived(self, broken: Mapping[str, str]) -> list[str]:
        """The derived keys among ``broken`` (the tick must heal them)."""
        return [key for key in (self.keys.due, self.keys.changed) if key in broken]

    def healed(self, broken: Mapping[str, str]) -> None:
        """Count every heal; warn once per onset, naming the key and what was wrong. The
        count is bookkeeping: with the counters of the wrong type it was refused before the
        heal, so the heal never happened and every tick stopped there (nothing dispatched);
        the counters are named once by the tick's other writes to them."""
        counts = {counter_field(CounterKind.HEALS, self._name(key)): 1
                  for key in self.derived(broken)}
        try:
            self.store.count_many(counts)
        except redis.ResponseError as exc:
            if self._said.get(self.keys.counters) != "refused":
                logger.error("cannot count the heal (%s): %s must be a hash; the heal goes on. "
                             "Fix: `redis-cli DEL %s`", exc, self.keys.counters,
                             self.keys.counters)
            self._said[self.keys.counters] = "refused"
        for key in self.derived(broken):
            if self._said.get(key) != broken[key]:
                what = ("held a value of the wrong type" if broken[key] == "wrong-type" else
                        "was deleted, emptied or restored from an older copy (its write stamp "
                        "disagrees with " + (self.keys.due_stamp if key == self.keys.due
                                             else self.keys.changed_stamp) + ")")
                logger.warning("derived key %s %s: rebuilt it from the lane records", key,
                               what)

    def report(self, broken: Mapping[str, str]) -> None:
        """Name each broken operator key and its fix once per onset; forget the fixed ones."""
        for key, problem in broken.items():
            if self._said.get(key) == problem or key in self.derived(broken):
                continue
            stops = STOPS.get(self._name(key), "what depends on it waits")
            what = ("is not a sane integer" if problem == "not-an-integer" else
                    "holds a value of the wrong type (Redis refused a command on it)")
            logger.error("key %s %s; %s. Fix: inspect it (`redis-cli TYPE %s`), then delete "
                         "it (`redis-cli DEL %s`) and redo what it held", key, what, stops,
                         key, key)
        self._said = dict(broken)

    def _name(self, key: str) -> str:
        return key.removeprefix(self.keys.prefix + ":")


__all__ = ["KEY_TYPES", "STOPS", "KeyHealth", "wrong_typed"]
