"""The status JSON's fields, written once: what ``schedproj status --json`` prints and the status
page's ``/api/status`` serves (built by :func:`schedproj.telemetry.status.as_json`, with the
schedule entries added by the CLI and by ``webserver.Deployment.status``).

The documentation's reference page (``reference/status.md``) is generated from
:data:`CATALOG`, and ``tests/telemetry/test_status_reference.py`` builds real status JSON from a
real beat's state and checks it against the catalog both ways: a key the JSON has and the
catalog lacks, a catalog path no output has, or a value of another type than the catalog says
fails it. So a field added to ``as_json`` (or to a dataclass it serializes, such as
``LaneHealth``) needs its line here.

Paths: ``a.b`` is key ``b`` of object ``a``; ``lanes[].name`` is key ``name`` of each object in
list ``lanes``; ``errors.<lane>`` is every key of a map whose keys are data (lane names, counter
names). Types: ``text``, ``number``, ``integer``, ``true/false``, ``object``, ``list of X``,
``map of X`` (an object whose keys are data), each possibly ``or null``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from schedproj.core.health import (
    MISSED_IN_A_ROW,
    UNDISPATCHED_AFTER_S,
    WAITERS_NAMED,
    Posture,
)
from schedproj.core.lanes import DeferralReason, DeploymentClass, LaneKind
from schedproj.core.records import Outcome
from schedproj.store.protocol import LEASE_ACQUISITIONS, CounterKind
from schedproj.telemetry.statuspage import ENTRIES_SHOWN


class Source(StrEnum):
    """Which of the two carries a field."""

    BOTH = "both"
    #: ``schedproj status --json`` only.
    CLI = "schedproj status --json"
    #: The status page's ``/api/status`` only.
    API = "/api/status"


@dataclass(frozen=True)
class StatusField:
    #: Where the key sits (see the module's docstring for the notation).
    path: str
    #: The JSON type of its value.
    type: str
    #: What it says, for an operator or a script reading it.
    meaning: str
    #: When the key is there at all ("": always, wherever its parent is). A key that is always
    #: there but may be null says so in its type and meaning instead.
    only_when: str = ""
    source: Source = Source.BOTH


#: The words ``status.lane_state_word`` gives a lane's ``state`` (the test checks what real
#: status JSON shows against them).
LANE_STATES = ("idle", "due", "deferred", "running", "paused", "paused, running",
               "disabled by profile")


def _setting(name: str) -> str:
    """A setting named in a meaning, linked to its entry on the settings page (the docs build
    fails if it has none)."""
    return f"([`{name}`](settings.md#setting-{name}))"


def _values(enum: Any) -> str:
    return ", ".join(f"`{member.value}`" for member in enum)


_F = StatusField
_IN_A_ROW = MISSED_IN_A_ROW
_CAL = "a calendar lane's"

#: The pressure on the lease, and (under ``pools[]``) on each pool's holders.
_PRESSURE: tuple[StatusField, ...] = (
    _F("pressure", "object", "The pressure on the lease: the heavy lane waiting for it."),
    _F("pressure.current", "object or null", "What beat last published as pressing on the "
       "lease; null: no heavy lane waits for it."),
    _F("pressure.current.lane", "text", "The waiting lane."),
    _F("pressure.current.cadence_s", "number", "Its cadence (seconds)."),
    _F("pressure.current.last_run_at", "number or null", "Its last run's end; null: never ran."),
    _F("pressure.current.priority0", "true/false", "It is a priority-0 lane: it presses "
       "whatever its ratio."),
    _F("pressure.current.fence", "integer", "The lease hold it presses on."),
    _F("pressure.current.at", "number", "When beat saw it (epoch seconds)."),
    _F("pressure.current.ratio", "number or null", "Its staleness ratio now; null when "
       "infinite."),
    _F("pressure.last_yield", "object or null", "The last run that stopped at a checkpoint "
       "for pressure; null: none yet."),
    _F("pressure.last_yield.lane", "text", "The lane that yielded."),
    _F("pressure.last_yield.task_id", "text", "Its run's task id."),
    _F("pressure.last_yield.fence", "integer", "Its lease hold."),
    _F("pressure.last_yield.held_s", "number", "Seconds it had held the lease."),
    _F("pressure.last_yield.at", "number", "When it yielded (epoch seconds)."),
    _F("pressure.last_yield.pressing", "text", "The lane it yielded to."),
    _F("pressure.last_yield.ratio", "number", "That lane's ratio then (capped at 1e9)."),
    _F("pressure.yields", "integer", "Pressure yields in all."),
)

#: Every key of the status JSON, in the order the JSON has them.
CATALOG: tuple[StatusField, ...] = (
    # -- the deployment --------------------------------------------------------------------
    _F("now", "number", "When this was read (epoch seconds, the reader's clock); every age "
       "and duration below is measured from it."),
    _F("posture", "text", f"The starvation watchdog's verdict now: one of {_values(Posture)}. "
       "`degraded` when a lane is starving or undispatched, a heavy calendar lane is missing "
       "its fire times or the lease is held past the hold cap; `unknown` when state cannot be "
       "read or there are no lanes."),
    _F("lease", "object or null", "The heavy-maintenance lease: who holds it and for how "
       "long; null while it is free."),
    _F("lease.holder", "text", "The lane holding the lease."),
    _F("lease.fence", "integer", "The grant's fencing number (it grows with each grant): "
       "a run carries it, and a run whose fence is no longer current is refused."),
    _F("lease.granted_at", "number", "When beat granted it (epoch seconds)."),
    _F("lease.started_at", "number or null", "When the run under it started on a worker; "
       "null while granted and not started."),
    _F("lease.held_s", "number", "Seconds held so far: since the run started, or since the "
       "grant while it has not."),
    _F("chain_depth", "integer", "The longest chain of lanes deferred behind one another, in "
       "links (0: no lane waits behind a deferred lane)."),
    _F("chain", "list of text", "That chain, the deferred lane first and the lane it finally "
       "waits on last."),
    _F("undeclared_lanes", "list of text", "Lanes with state under this key prefix that the "
       "last beat does not declare: another app's beat runs with the same prefix."),
    _F("starving", "list of text", "Lanes deferred longer than the starvation threshold "
       + _setting("SCHEDPROJ_STARVATION_THRESHOLD_S") + "."),
    _F("undispatched", "list of objects", f"Lanes due for over {UNDISPATCHED_AFTER_S:g} s "
       "with beat neither dispatching, deferring nor pausing them: scheduling stopped for "
       "them (is beat running?)."),
    _F("undispatched[].lane", "text", "The lane."),
    _F("undispatched[].due_since", "number", "Since when it has been due with beat not "
       "acting on it (epoch seconds)."),
    _F("missing", "list of text", f"Heavy calendar lanes that missed their last {_IN_A_ROW} "
       "fire times in a row (their catch-up window passed unrun) and are not running now."),
    _F("lease_over_cap", "true/false", "The run holding the lease has held it past the hold "
       "cap " + _setting("SCHEDPROJ_HOLD_CAP_S") + "."),
    _F("slots_over_cap", "list of text", "Slots of the pools beyond the default (`pool:slot`) "
       "whose run has held them past the hold cap: the posture is degraded, as for the lease."),
    # -- lanes -----------------------------------------------------------------------------
    _F("lanes", "list of objects", "One row per lane of its own, by declared `order` then name; "
       "family "
       "members are folded into `families`. With `--family NAME` (CLI only): that family's "
       "members instead."),
    _F("lanes[].name", "text", "The lane's name (a member's is `family[key]`)."),
    _F("lanes[].kind", "text", f"One of {_values(LaneKind)}."),
    _F("lanes[].queue", "text", "The queue its runs are sent to."),
    _F("lanes[].deployment", "text", f"Its deployment class: one of "
       f"{_values(DeploymentClass)}."),
    _F("lanes[].enabled", "true/false", "Whether the deployment profile "
       + _setting("SCHEDPROJ_PROFILE") + " runs it."),
    _F("lanes[].paused", "true/false", "Paused by an operator (`schedproj pause NAME`)."),
    _F("lanes[].cadence_s", "number", "Its cadence in seconds (a calendar lane's: the nominal "
       "period of its schedule)."),
    _F("lanes[].last_run_at", "number or null", "When its last run ended (epoch seconds); "
       "null: never ran."),
    _F("lanes[].ratio", "number or null", "Its staleness ratio: time since its last run over "
       "its cadence (1 = exactly due); null when infinite (it never ran)."),
    _F("lanes[].due", "true/false", "Due now."),
    _F("lanes[].in_flight", "true/false", "A run of it was sent or is running."),
    _F("lanes[].backlog", "integer", "The backlog its last run or its due-check reported."),
    _F("lanes[].last_outcome", "text or null", f"How its last run ended: one of "
       f"{_values(Outcome)}; null: never ran."),
    _F("lanes[].last_reason", "text or null", "Why, for a run that failed, yielded or was "
       "refused."),
    _F("lanes[].runs", "integer", "Runs in all."),
    _F("lanes[].failures", "integer", "Runs that failed (lost runs included)."),
    _F("lanes[].dispatches", "integer", "Times beat sent it."),
    _F("lanes[].deferral_reason", "text or null", "Why beat is holding it back now (one of "
       f"{_values(DeferralReason)}; see [Lane options](lanes.md)); null: not deferred."),
    _F("lanes[].deferral_blocker", "text or null", "What it waits for (a lane, or the lease "
       "holder); null: not deferred."),
    _F("lanes[].deferred_for_s", "number or null", "Seconds deferred so far; null: not "
       "deferred."),
    _F("lanes[].due_since", "number or null", "Due since then with no dispatch, deferral or "
       "pause (epoch seconds); null: not due, or beat acted on it."),
    _F("lanes[].schedule", "text or null", f"{_CAL} schedule in words (`crontab 30 2 * * * "
       "Europe/Berlin`, or a custom schedule's text); null: a cadence lane."),
    _F("lanes[].timezone", "text or null", f"The IANA zone {_CAL} fire times are read in; "
       "null for a cadence lane, or when not known here."),
    _F("lanes[].next_fire_at", "number or null", f"{_CAL} next fire time (epoch seconds); "
       "null: a cadence lane, a schedule that fires no more, or one only its own code "
       "computes while the due index has no look for it."),
    _F("lanes[].missed", "integer", f"Fire times {_CAL[2:]} catch-up window skipped, in all "
       "(0 for a cadence lane)."),
    _F("lanes[].missed_through", "number or null", "The latest fire time it skipped (epoch "
       "seconds); null: none."),
    _F("lanes[].missed_in_a_row", "integer", "Fire times missed in a row since it last ran, "
       f"counted up to {_IN_A_ROW}."),
    _F("lanes[].state", "text", "The lane in one word, as `schedproj status` shows it: one of "
       + ", ".join(f"`{s}`" for s in LANE_STATES) + "."),
    _F("lanes[].next_fire_local", "text or null", "`next_fire_at` in the lane's zone, ISO "
       "8601 with its offset (`2026-12-05T02:30:00+01:00`); null when `next_fire_at` is."),
    _F("lanes[].next_fire_utc", "text or null", "`next_fire_at` in UTC, ISO 8601; null when "
       "`next_fire_at` is."),
    _F("lanes[].next_fire_from", "text or null", "Where `next_fire_at` comes from: `schedule` "
       "(its fire times, computed here) or `due index` (beat's next look, for a schedule only "
       "its own code computes); null when there is none."),
    # -- families --------------------------------------------------------------------------
    _F("families", "list of objects", "One row per lane family the last beat declared, its "
       "members folded (`schedproj status --family NAME` lists them)."),
    _F("families[].family", "text", "The family's name."),
    _F("families[].kind", "text", f"One of {_values(LaneKind)}."),
    _F("families[].members", "integer", "How many members it has."),
    _F("families[].due", "integer", "Members due and waiting (neither deferred nor "
       "running)."),
    _F("families[].deferred", "integer", "Members deferred now (not running)."),
    _F("families[].running", "integer", "Members in flight."),
    _F("families[].max_ratio", "number or null", "The worst member's staleness ratio (0 "
       "while no member has state); null when infinite (a member never ran)."),
    _F("families[].worst", "text or null", "The member with that ratio; null: no member has "
       "state yet."),
    _F("families[].schedule", "text or null", "A calendar family's schedule in words; null: a "
       "cadence family."),
    # -- beat, watchdog --------------------------------------------------------------------
    _F("beat", "object", "What the active beat says of itself (its lock token left out)."),
    _F("beat.host", "text", "The host it runs on.", only_when="a beat has run with this "
       "prefix"),
    _F("beat.pid", "text", "Its process id.", only_when="a beat has run with this prefix"),
    _F("beat.since", "text", "When it took over (epoch seconds, as text).",
       only_when="a beat has run with this prefix and the time is readable"),
    _F("beat.id", "text", "Its short id, as its log lines name it.",
       only_when="a beat has run with this prefix"),
    _F("beat.lock_held", "true/false", "It still holds the beat lock (false: its lock "
       "expired; no beat is active)."),
    _F("watchdog", "object or null", "The starvation watchdog's latch, as its lane last "
       "wrote it; null until the watchdog lane has run."),
    _F("watchdog.v", "integer", "The record's format version."),
    _F("watchdog.posture", "text", "The posture it last assessed."),
    _F("watchdog.assessed_at", "number", "When (epoch seconds)."),
    _F("watchdog.stalled", "true/false", "A stall is on (the posture was degraded)."),
    _F("watchdog.stall_since", "number or null", "When the current stall began; null: none."),
    _F("watchdog.alarm_fired_at", "number or null", "When it last raised the alarm."),
    _F("watchdog.cleared_at", "number or null", "When the last stall cleared."),
    _F("watchdog.alarms", "integer", "Stalls alarmed in all."),
    _F("watchdog.reasons", "list of text", "Why, as `starving:LANE`, `undispatched:LANE`, "
       "`missed-fires:LANE`, `lease-over-cap:LANE`, `unreadable:NAME`."),
    # -- errors, counters, problems --------------------------------------------------------
    _F("errors", "map of text", "Scheduling errors by lane: a due-check that raised, lane state "
       "that cannot be read (`<lease>`: the lease record)."),
    _F("errors.<lane>", "text", "The error and its fix.", only_when="that lane has an error"),
    # The pipe as an HTML entity: in a Markdown table cell an escaped pipe in code shows its
    # backslash.
    _F("counters", "map of integer", "The deployment's labelled counters, as "
       "[metrics](metrics.md) export them: keys <code>KIND&#124;LABEL</code>, KIND one of "
       f"{_values(CounterKind)}."),
    _F("counters.<counter>", "integer", "The count.", only_when="the counter has counted"),
    _F("lease_acquisitions", "integer", f"Heavy lease grants in all (`{LEASE_ACQUISITIONS}`)."),
    _F("problems", "list of text", "What cannot be read or used (a key of the wrong type, an "
       "unreadable registry), each with its fix. `/api/status` adds the schedule entries' "
       "problems here."),
    # -- pressure --------------------------------------------------------------------------
    *_PRESSURE,
    # -- pools ------------------------------------------------------------------------------
    _F("pools", "list of objects", "Every pool (docs: pools.md): the default pool `heavy` "
       "first (its one slot is the lease above), then the declared pools by name."),
    _F("pools[].pool", "text", "The pool's name (its lanes' queue)."),
    _F("pools[].slots", "integer", "Its slots: at most this many of its runs at once."),
    _F("pools[].busy", "integer", "Slots held now (granted or running)."),
    _F("pools[].holders", "list of objects", "One per busy slot, lowest slot first."),
    _F("pools[].holders[].slot", "integer", "The slot (0-based; `schedproj clear-lease "
       "--pool P --slot I` names it)."),
    _F("pools[].holders[].holder", "text", "The lane holding it (a lane taking k slots holds "
       "k of them); empty when the slot's record cannot be read (it still counts as busy)."),
    _F("pools[].holders[].fence", "integer", "The slot grant's fencing number."),
    _F("pools[].holders[].granted_at", "number", "When beat granted it (epoch seconds)."),
    _F("pools[].holders[].started_at", "number or null", "When the run under it started; "
       "null while granted and not started."),
    _F("pools[].holders[].held_s", "number", "Seconds held so far: since the run started, "
       "or since the grant while it has not."),
    _F("pools[].waiting", "integer", "The pool's waiters: its heavy lanes that are due, "
       "enabled, not paused and hold no slot."),
    _F("pools[].waiters", "list of text", f"The first {WAITERS_NAMED} of them, in beat's "
       "ranking (priority-0, then weighted staleness ratio, then order, then name)."),
    _F("pools[].pressure", "object", "The pressure on the pool's holders, with the keys of "
       "`pressure` above (for the default pool, the same object)."),
    *(_F(f"pools[].{f.path}", f.type, f"As `{f.path}`, for the pool's longest holder.")
      for f in _PRESSURE if f.path != "pressure"),
    # -- schedule entries (added by the CLI and by /api/status) ----------------------------
    _F("entries", "list of objects", "The schedule entries (the app's `beat_schedule` and "
       "runtime entries). `schedproj status --json` lists all, by name; `/api/status` the "
       f"earliest due first, at most {ENTRIES_SHOWN} (see `entries_total`)."),
    _F("entries[].name", "text", "The entry's name."),
    _F("entries[].task", "text", "The task it sends (`?` when unreadable)."),
    _F("entries[].schedule", "text", "Its schedule in words."),
    _F("entries[].source", "text", "Where it is declared: `code` (the app's `beat_schedule`) "
       "or `runtime` (`schedproj entry add`; `runtime (not yet read by beat)` until beat reads "
       "it)."),
    _F("entries[].last_run_at", "number or null", "When beat last sent it (epoch seconds); "
       "null: never."),
    _F("entries[].runs", "integer", "Times sent in all."),
    _F("entries[].next_due_at", "number or null", "When it is next due (epoch seconds); "
       "null: not in the due index."),
    _F("entries[].paused", "true/false", "Paused by an operator (`schedproj pause NAME`)."),
    _F("entries[].problem", "text", "Why its state or definition cannot be read (empty when "
       "it can)."),
    _F("entry_problems", "list of text", "The schedule entries' keys that cannot be read, "
       "each with its fix (`/api/status` puts these in `problems`).", source=Source.CLI),
    _F("entries_total", "integer", "How many entries there are (`entries` lists at most "
       f"{ENTRIES_SHOWN}).", source=Source.API),
)


def by_path() -> dict[str, StatusField]:
    return {f.path: f for f in CATALOG}


def map_keys() -> dict[str, str]:
    """The maps (objects whose keys are data) and the placeholder their keys take in a path:
    ``{"errors": "<lane>", ...}``."""
    maps = {f.path for f in CATALOG if f.type.removesuffix(" or null").startswith("map of ")}
    return {f.path.rpartition(".")[0]: f.path.rpartition(".")[2] for f in CATALOG
            if f.path.rpartition(".")[0] in maps}


def key_paths(data: Mapping[str, Any], prefix: str = "",
              maps: Mapping[str, str] | None = None) -> Iterator[tuple[str, Any]]:
    """Every key of status JSON as (its catalog path, its value), a map's keys read as its
    placeholder."""
    maps = map_keys() if maps is None else maps
    for key, value in data.items():
        path = f"{prefix}{key}"
        yield path, value
        if path in maps and isinstance(value, Mapping):
            yield from ((f"{path}.{maps[path]}", v) for v in value.values())
        elif isinstance(value, Mapping):
            yield from key_paths(value, f"{path}.", maps)
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, Mapping):
                    yield from key_paths(item, f"{path}[].", maps)


_SCALARS: dict[str, Any] = {
    "text": lambda v: isinstance(v, str),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "true/false": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, Mapping), "objects": lambda v: isinstance(v, Mapping),
}


def fits(value: Any, kind: str) -> bool:
    """Whether a JSON value is of a catalog type (``list of text or null``, ...)."""
    if kind.endswith(" or null"):
        return value is None or fits(value, kind.removesuffix(" or null"))
    if kind.startswith("list of "):
        return isinstance(value, list) and all(fits(v, kind[8:]) for v in value)
    if kind.startswith("map of "):
        return isinstance(value, Mapping) and all(fits(v, kind[7:]) for v in value.values())
    return bool(_SCALARS[kind](value))


def disagreements(data: Mapping[str, Any], source: Source) -> list[str]:
    """What in ``data`` (status JSON from ``source``) the catalog does not say: a key it
    lacks or gives to the other source, a value of another type."""
    fields, found = by_path(), []
    for path, value in key_paths(data):
        field = fields.get(path)
        if field is None:
            found.append(f"{path}: not in the catalog")
        elif field.source not in (Source.BOTH, source):
            found.append(f"{path}: the catalog gives it to {field.source.value} only")
        elif not fits(value, field.type):
            found.append(f"{path}: {value!r} is not {field.type}")
    return found


__all__ = ["CATALOG", "LANE_STATES", "Source", "StatusField", "disagreements", "fits",
           "key_paths", "map_keys"]
