"""The Redis protocol, defined once: every key name (built from one prefix), every field of
the counters hash, the limits and the record format versions that Python and the Lua scripts
share. Both sides of the wire import from here; the Lua scripts get these values as arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from schedproj.core.defaults import STATE_VERSION
from schedproj.core.laneset import REGISTRY_VERSION
from schedproj.core.pools import DEFAULT_POOL
from schedproj.core.pressure import PRESSURE_VERSION

#: Format version of the watchdog's alarm latch (``<prefix>:watchdog``).
WATCHDOG_VERSION = 1
#: Format version of the epoch record (``<prefix>:epoch``), which detects state loss.
EPOCH_VERSION = 1
#: The wake list never holds more than this many entries: one wake-up is as good as many.
WAKE_LIST_MAX = 64
#: The member of the due index whose score is the index's write stamp, and the prefix of the
#: changed set's stamp member (``<STAMP_MEMBER>:<generation>``); no lane name starts with NUL.
STAMP_MEMBER = "\x00stamp"
#: The member of the changed set that tells beat the schedule entries changed (a runtime entry
#: added, changed or removed; one paused, resumed or asked to run): it re-reads them.
ENTRIES_CHANGED_MEMBER = "\x00entries"


@dataclass(frozen=True)
class Keys:
    """Key names under one prefix. ``Keys("schedproj").lease == "schedproj:lease"``."""

    prefix: str

    @property
    def lanes(self) -> str:
        """Hash: field ``<lane>|run`` (written by workers), ``<lane>|sched`` (written by beat)."""
        return f"{self.prefix}:lanes"

    @property
    def lease(self) -> str:
        """String (JSON): the heavy lease record, with a Redis TTL."""
        return f"{self.prefix}:lease"

    @property
    def epoch(self) -> str:
        """String (JSON): which Redis server process holds this state, and the quarantine after
        it was lost (see ``lua/epoch.lua``). No TTL."""
        return f"{self.prefix}:epoch"

    @property
    def pressure(self) -> str:
        """Hash: ``current`` (JSON, ``core.pressure.encode``: the waiting heavy lane beat saw
        pressing on the lease at its last tick; the holder reads it in its renewal reply),
        ``last-yield`` (JSON: the last run that yielded to pressure), ``yields`` (integer:
        pressure yields so far)."""
        return f"{self.prefix}:pressure"

    @property
    def lease_request(self) -> str:
        """String (JSON, ``store.lease.OperatorRequest``): what an operator asked of the lease
        holder with ``schedproj clear-lease`` (stop, terminate, or its lease cleared), with a
        TTL. The holder's renewals read it; beat reads it to record such a run ``cleared``."""
        return f"{self.prefix}:lease:request"

    @property
    def lease_fence(self) -> str:
        """Integer: the fencing counter, incremented on every lease grant. Never decreases."""
        return f"{self.prefix}:lease:fence"

    @property
    def beat_lock(self) -> str:
        """String (JSON): the single-active-beat lock, with a Redis TTL."""
        return f"{self.prefix}:beat:lock"

    @property
    def beat_fence(self) -> str:
        """Integer: incremented each time a beat takes the lock."""
        return f"{self.prefix}:beat:fence"

    @property
    def wake(self) -> str:
        """List: a finishing run pushes here; the active beat blocks on it between ticks."""
        return f"{self.prefix}:wake"

    @property
    def beat_info(self) -> str:
        """Hash: who the active beat is (token, host, pid, since), for operators."""
        return f"{self.prefix}:beat:info"

    @property
    def published_lanes(self) -> str:
        """String (JSON): the lanes beat schedules, so status works without the app's code.
        (The key is still spelled ``registry``, as deployments already store it.)"""
        return f"{self.prefix}:registry"

    @property
    def pools(self) -> str:
        """Hash: pool name -> the most slots any beat has declared it with (never lowered;
        ``lua/pools_declare.lua``). Beat reads the slots of earlier declarations too: a run
        may still hold a slot of a pool a deploy shrank or removed. Losing it loses only that
        memory of earlier declarations; beat writes its own declaration back."""
        return f"{self.prefix}:pools"

    @property
    def paused(self) -> str:
        """Set: lanes an operator paused (never dispatched until resumed)."""
        return f"{self.prefix}:paused"

    @property
    def run_now(self) -> str:
        """Set: lanes an operator asked to run now (due at once; still through the lease)."""
        return f"{self.prefix}:run-now"

    @property
    def watchdog(self) -> str:
        """String (JSON): the starvation watchdog's posture and alarm latch."""
        return f"{self.prefix}:watchdog"

    @property
    def counters(self) -> str:
        """Hash: durable event counters (``deferrals|<reason>``, ``yields|<lane>``, ...)."""
        return f"{self.prefix}:counters"

    @property
    def journal(self) -> str:
        """List (JSON): run starts and ends with their fencing numbers, for the audit."""
        return f"{self.prefix}:journal"

    @property
    def dispatch_log(self) -> str:
        """List (JSON): every message beat sent (lane, task id, fence), for the audit."""
        return f"{self.prefix}:dispatch-log"

    @property
    def due(self) -> str:
        """Sorted set: lane -> when beat must next look at it (epoch seconds; ``inf``: only a
        change will make it due). Written atomically with every record that moves it (see
        ``core.dueindex``); a family member is in it exactly while it is a member."""
        return f"{self.prefix}:due"

    @property
    def changed(self) -> str:
        """Set: lanes whose records, pause or run-now changed since the active beat last read
        it (it empties the set as it reads it)."""
        return f"{self.prefix}:changed"

    @property
    def due_stamp(self) -> str:
        """Integer: the due index's write stamp, bumped with the index's own stamp member
        (:data:`STAMP_MEMBER`) by every stamped writer while the two agree. A deleted, emptied,
        replaced or restored index shows a stamp that disagrees: beat rebuilds it."""
        return f"{self.prefix}:due:stamp"

    @property
    def changed_reading(self) -> str:
        """Set: a changed set too large for one call, kept aside while beat reads it by pages
        (``lua/tick_read.lua``); deleted by the page that ends the read, so a beat that stops
        mid-read leaves it for the next read."""
        return f"{self.prefix}:changed:reading"

    @property
    def changed_stamp(self) -> str:
        """Integer: the changed set's generation, bumped by beat each time it empties the set
        and re-adds ``<STAMP_MEMBER>:<generation>``; a set without that member was lost."""
        return f"{self.prefix}:changed:stamp"

    @property
    def families(self) -> str:
        """Set: names of the lane families that have (or had) members."""
        return f"{self.prefix}:families"

    def family(self, name: str) -> str:
        """Set: the member keys of lane family ``name``."""
        return f"{self.prefix}:family:{name}"

    @property
    def entries(self) -> str:
        """Hash: schedule entry -> its state (JSON, ``core.entries.EntryState``: last run, run
        count, the schedule it measures from). Written only under the beat lock, compared and
        set (``lua/entry_write.lua``)."""
        return f"{self.prefix}:entries"

    @property
    def entries_due(self) -> str:
        """Sorted set: schedule entry -> when beat must next look at it (epoch seconds),
        written with the state that moves it."""
        return f"{self.prefix}:entries:due"

    @property
    def entry_defs(self) -> str:
        """Hash: runtime entry -> its definition (JSON, ``core.entries.EntryDefinition``),
        written by ``schedproj entry add`` and the Python API; beat reads it."""
        return f"{self.prefix}:entries:defs"

    @property
    def entries_info(self) -> str:
        """Hash: schedule entry -> what it is (JSON: task, schedule, source ``code`` or
        ``runtime``), published by the active beat so status, metrics and the verbs work
        without the app's code."""
        return f"{self.prefix}:entries:info"

    @property
    def entries_info_staging(self) -> str:
        """Hash: :attr:`entries_info` while beat writes it afresh, in parts (renamed over it
        when complete, so readers see the old listing or the new one, never part of one)."""
        return f"{self.prefix}:entries:info:staging"

    @property
    def entries_paused(self) -> str:
        """Set: schedule entries an operator paused (never sent until resumed)."""
        return f"{self.prefix}:entries:paused"

    @property
    def entries_run_now(self) -> str:
        """Set: schedule entries an operator asked to run now (sent at the next tick)."""
        return f"{self.prefix}:entries:run-now"

    @property
    def errors(self) -> str:
        """Hash: lane -> last scheduling error (due-check raised, malformed state)."""
        return f"{self.prefix}:errors"

    def slot(self, pool: str, slot: int) -> Keys:
        """The keys of slot ``slot`` (0-based) of ``pool``: every slot is a lease like the
        heavy lease, with its own record, fencing counter and operator request; the pool's
        holders share the pool's pressure hash. The default pool's one slot *is* the heavy
        lease: its keys are these very keys (nothing to migrate)."""
        if pool == DEFAULT_POOL and slot == 0:
            return self
        return SlotKeys(self.prefix, pool=pool, index=slot)


@dataclass(frozen=True)
class SlotKeys(Keys):
    """The keys of one slot of a pool beyond the default: ``<prefix>:pool:<pool>:slot:<i>``
    (the lease record, with a TTL), ``...:fence`` (its fencing counter), ``...:request`` (an
    operator's request to its holder), and ``<prefix>:pool:<pool>:pressure`` (the pressure
    on the pool's holders). Every other key is the deployment's, so a store or lease built on
    these keys finishes, renews and releases a run under its slot and nothing else."""

    pool: str = DEFAULT_POOL
    index: int = 0

    @property
    def lease(self) -> str:
        """String (JSON): the slot's lease record (as the heavy lease's), with a Redis TTL."""
        return f"{self.prefix}:pool:{self.pool}:slot:{self.index}"

    @property
    def lease_fence(self) -> str:
        """Integer: the slot's fencing counter (never below Redis's clock in ms at a grant,
        so fences of one pool's slots compare as grant times). Never decreases."""
        return f"{self.lease}:fence"

    @property
    def pool_fence(self) -> str:
        """Integer: the last fence granted in the pool, on any slot: each grant's fence is
        above it, so fences are distinct across the pool's slots (a fence names one hold)."""
        return f"{self.prefix}:pool:{self.pool}:fence"

    @property
    def lease_request(self) -> str:
        """String (JSON): an operator's request to the slot's holder, with a TTL."""
        return f"{self.lease}:request"

    @property
    def pressure(self) -> str:
        """Hash: the pressure on the pool's holders (``current``; the same fields as
        :attr:`Keys.pressure`)."""
        return f"{self.prefix}:pool:{self.pool}:pressure"


def pool_acquisitions(pool: str) -> str:
    """The counters-hash field counting slot grants of ``pool`` (the default pool's are
    :data:`LEASE_ACQUISITIONS`)."""
    return LEASE_ACQUISITIONS if pool == DEFAULT_POOL else f"pool_acquisitions|{pool}"


def run_field(lane: str) -> str:
    return f"{lane}|run"


def sched_field(lane: str) -> str:
    return f"{lane}|sched"


class CounterKind(StrEnum):
    """The families of fields in the counters hash: ``<kind>|<label>``."""

    #: Deferral streaks begun, labelled by reason.
    DEFERRALS = "deferrals"
    #: Heavy runs that yielded at a checkpoint, by lane.
    YIELDS = "yields"
    #: Messages refused (stale, forged or missing token), by lane.
    SKIPS = "skips"
    #: Scheduling errors (a due-check raised, unreadable state), by lane.
    ERRORS = "errors"
    #: Runs that started and whose lease or in-flight mark lapsed with no end, by lane.
    LOST = "lost"
    #: Derived keys (due index, changed set) beat found broken and rebuilt, by key.
    HEALS = "derived_heals"
    #: Calendar lanes' fire times skipped for their catch-up window, by lane.
    MISSED = "missed"


#: The unlabelled counter of heavy lease grants (bumped by ``lease_acquire.lua``).
LEASE_ACQUISITIONS = "lease_acquisitions"


def counter_field(kind: CounterKind, label: str) -> str:
    """The counters-hash field of one labelled counter, e.g. ``yields|summary``."""
    return f"{kind.value}|{label}"


def parse_counter_field(name: str) -> tuple[CounterKind, str] | None:
    """(kind, label) of a labelled counter field; None for anything else."""
    kind, sep, label = name.partition("|")
    if not sep:
        return None
    try:
        return CounterKind(kind), label
    except ValueError:
        return None


__all__ = [
    "ENTRIES_CHANGED_MEMBER",
    "EPOCH_VERSION",
    "LEASE_ACQUISITIONS",
    "PRESSURE_VERSION",
    "REGISTRY_VERSION",
    "STAMP_MEMBER",
    "STATE_VERSION",
    "WAKE_LIST_MAX",
    "WATCHDOG_VERSION",
    "CounterKind",
    "Keys",
    "SlotKeys",
    "counter_field",
    "parse_counter_field",
    "pool_acquisitions",
    "run_field",
    "sched_field",
]
