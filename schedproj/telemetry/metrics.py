"""Prometheus metrics, served by beat on ``SCHEDPROJ_METRICS_PORT`` (loopback by default).

Every figure is read from Redis at scrape time — lane records, the lease, durable counters — so
the numbers survive restarts of beat and workers and agree with ``schedproj status``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import redis
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from schedproj.core.families import split_member
from schedproj.core.lanes import LaneSpec
from schedproj.core.pools import DEFAULT_POOL
from schedproj.settings import Settings
from schedproj.store.protocol import (
    LEASE_ACQUISITIONS,
    CounterKind,
    Keys,
    parse_counter_field,
    pool_acquisitions,
)
from schedproj.telemetry.entries_view import read_entries
from schedproj.telemetry.observe import Observation, observe
from schedproj.telemetry.status import families_folded, next_fire

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class MetricDoc:
    """One metric beat exports: its name as prometheus_client takes it (a counter's without
    ``_total``), its type, help text and labels. The catalog below is the one place they are
    written; the collector builds its families from it and the reference page is made from it."""

    name: str
    kind: Literal["gauge", "counter"]
    help: str
    labels: tuple[str, ...] = ()

    @property
    def exposed(self) -> str:
        """The name Prometheus scrapes (counters end in ``_total``)."""
        return f"{self.name}_total" if self.kind == "counter" else self.name


def _gauge(name: str, help: str, *labels: str) -> MetricDoc:
    return MetricDoc(name, "gauge", help, labels)


def _counter(name: str, help: str, *labels: str) -> MetricDoc:
    return MetricDoc(name, "counter", help, labels)


#: Every metric beat's ``/metrics`` serves, in the order it serves them.
CATALOG: tuple[MetricDoc, ...] = (
    _gauge("schedproj_state_up", "Redis state readable."),
    _gauge("schedproj_lease_held_seconds", "How long the heavy lease has been held (0: free).",
           "lane"),
    _gauge("schedproj_lease_fence", "Fencing number of the held lease."),
    _gauge("schedproj_lease_over_hold_cap", "1 while the lease is held past the hold cap."),
    _gauge("schedproj_deferral_chain_depth",
           "Longest chain of lanes deferred behind one another."),
    _gauge("schedproj_undispatched_lanes", "Lanes due past their bound that beat neither "
           "dispatched, deferred nor saw paused (scheduling stopped for them)."),
    _gauge("schedproj_posture", "Watchdog posture (1 = current).", "posture"),
    _gauge("schedproj_lane_staleness_ratio", "(now - last run) / cadence; +Inf if never run.",
           "lane"),
    _gauge("schedproj_lane_deferred_seconds",
           "Age of the lane's current deferral streak (0: none).", "lane", "reason"),
    _gauge("schedproj_lane_backlog", "Backlog the lane reported.", "lane"),
    _gauge("schedproj_lane_next_fire_timestamp_seconds", "A calendar lane's next fire time "
           "(Unix time); for a schedule only its own code computes, the due index's next look. "
           "Cadence lanes have no series.", "lane"),
    _counter("schedproj_lane_runs", "Finished runs.", "lane"),
    _counter("schedproj_lane_failures", "Failed runs.", "lane"),
    _counter("schedproj_dispatches", "Messages sent by beat.", "lane", "queue"),
    _gauge("schedproj_family_members", "Members of the lane family.", "family"),
    _gauge("schedproj_family_due", "Members due and not yet dispatched or deferred.",
           "family"),
    _gauge("schedproj_family_deferred", "Members deferred (lease, gate or pick).", "family"),
    _gauge("schedproj_family_running", "Members running or in flight.", "family"),
    _gauge("schedproj_family_max_staleness_ratio", "Largest staleness ratio among the "
           "members with state (+Inf: one never ran).", "family"),
    _counter("schedproj_deferrals", "Deferral streaks begun, by reason.", "reason"),
    _counter("schedproj_yields", "Heavy runs that yielded at a checkpoint.", "lane"),
    _counter("schedproj_stale_token_refusals",
             "Heavy messages refused for a stale, forged or missing lease token.", "lane"),
    _counter("schedproj_scheduling_errors",
             "Scheduling errors (a due-check raised, unreadable state).", "lane"),
    _counter("schedproj_lost_runs", "Runs that started and whose lease or in-flight mark "
             "lapsed with no end recorded (their worker died).", "lane"),
    _counter("schedproj_derived_state_heals", "Derived keys (due index, changed set) found "
             "missing, emptied, of the wrong type or restored from an older copy, and rebuilt "
             "by beat.", "key"),
    _counter("schedproj_missed_runs", "Fire times of a calendar lane, or of a crontab schedule "
             "entry (labelled with the entry's name), skipped because they passed its catch-up "
             "window with no run (catchup_window_s; beat_cron_starting_deadline for entries).",
             "lane"),
    _counter(f"schedproj_{LEASE_ACQUISITIONS}", "Heavy lease grants (the fencing counter)."),
    _gauge("schedproj_pool_slots", "Slots of the pool (the default pool heavy: 1, the lease).",
           "pool"),
    _gauge("schedproj_pool_slots_busy", "Slots of the pool held now (granted or running).",
           "pool"),
    _gauge("schedproj_pool_slot_held_seconds", "How long the slot has been held: since its "
           "run started, or since the grant while it has not (0: free).", "pool", "slot"),
    _gauge("schedproj_pool_slot_fence", "Fencing number of the slot's grant (0: free).",
           "pool", "slot"),
    _gauge("schedproj_pool_waiting", "Heavy lanes of the pool that are due, enabled, not "
           "paused and hold no slot.", "pool"),
    _counter("schedproj_pool_acquisitions", "Slot grants of the pool (the default pool's: the "
             "heavy lease grants).", "pool"),
    _gauge("schedproj_pressure_ratio", "Staleness ratio now of the waiting heavy lane that "
           "presses on the lease (+Inf: never ran; 0 with lane=\"\": none).", "lane"),
    _gauge("schedproj_last_pressure_yield_timestamp_seconds", "When a heavy run last yielded "
           "to pressure (Unix time; 0: never), with the lane that yielded and the one that "
           "pressed.", "lane", "pressing"),
    _counter("schedproj_pressure_yields",
             "Heavy runs that yielded to pressure before the hold cap."),
    _gauge("schedproj_entries", "Schedule entries beat runs (beat_schedule and runtime), by "
           "source.", "source"),
    _gauge("schedproj_entries_overdue", "Schedule entries whose next look is more than a "
           "minute past (not paused), or missing from the due index: beat is not sending "
           "them."),
    _counter("schedproj_entry_runs", "Times the schedule entry was sent (its run count).",
             "entry"),
    _gauge("schedproj_entry_last_run_timestamp_seconds",
           "When the schedule entry was last sent (Unix time; 0: never).", "entry"),
    _gauge("schedproj_entry_next_due_timestamp_seconds",
           "When beat next looks at the schedule entry (Unix time).", "entry"),
)
#: Per-entry series are exported for at most this many entries (the earliest due first): a
#: hundred thousand entries would be half a million series. The aggregates cover them all.
ENTRY_SERIES_MAX = 1000
#: An entry whose next look is this far past (seconds) counts as overdue.
ENTRY_OVERDUE_AFTER_S = 60.0
_BY_NAME = {m.name: m for m in CATALOG}

#: Durable counter hash field prefix -> the metric that exports it (labelled by its suffix).
COUNTERS = {
    CounterKind.DEFERRALS: "schedproj_deferrals",
    CounterKind.YIELDS: "schedproj_yields",
    CounterKind.SKIPS: "schedproj_stale_token_refusals",
    CounterKind.ERRORS: "schedproj_scheduling_errors",
    CounterKind.LOST: "schedproj_lost_runs",
    CounterKind.HEALS: "schedproj_derived_state_heals",
    CounterKind.MISSED: "schedproj_missed_runs",
}


def family(name: str) -> GaugeMetricFamily | CounterMetricFamily:
    """An empty metric family for ``name``, as the catalog describes it."""
    doc = _BY_NAME[name]
    cls = GaugeMetricFamily if doc.kind == "gauge" else CounterMetricFamily
    return cls(doc.name, doc.help, labels=list(doc.labels))


class SchedprojCollector(Collector):
    """Reads one deployment's durable state on every scrape."""

    def __init__(self, client: redis.Redis, keys: Keys, settings: Settings,
                 specs: tuple[LaneSpec, ...],
                 families: list[dict[str, Any]] | None = None) -> None:
        self.client, self.keys, self.settings, self.specs = client, keys, settings, specs
        self.families = families or []

    def collect(self) -> Iterator[Metric]:
        try:
            obs = observe(self.client, self.keys, specs=self.specs, families=self.families)
        except redis.RedisError:
            logger.warning("metrics: Redis unreachable; scrape has no schedproj figures")
            up = family("schedproj_state_up")
            up.add_metric([], 0)
            yield up
            return
        s = self.settings
        health = obs.health(starvation_threshold_s=s.starvation_threshold_s,
                            hold_cap_s=s.hold_cap_s, profile=s.profile)
        up = family("schedproj_state_up")
        up.add_metric([], 1)
        yield up
        yield from self._lease(health)
        yield from self._lanes(health, obs)
        yield from self._families(health, obs)
        yield from self._counters(obs.counters, obs.lease_acquisitions, obs)
        yield from self._pools(health, obs)
        yield from self._pressure(obs)
        yield from self._entries(obs.now)

    def _entries(self, now: float) -> Iterator[Metric]:
        view = read_entries(self.client, self.keys)
        count = family("schedproj_entries")
        by_source: dict[str, int] = {}
        for e in view.entries:
            source = e.source.split(" ")[0]
            by_source[source] = by_source.get(source, 0) + 1
        for source, n in sorted(by_source.items()):
            count.add_metric([source], n)
        yield count
        overdue = family("schedproj_entries_overdue")
        overdue.add_metric([], sum(1 for e in view.entries
                                   if e.overdue(now, ENTRY_OVERDUE_AFTER_S)))
        yield overdue
        runs, last, due = (family(n) for n in (
            "schedproj_entry_runs", "schedproj_entry_last_run_timestamp_seconds",
            "schedproj_entry_next_due_timestamp_seconds"))
        shown = sorted(view.entries, key=lambda e: (e.next_due_at is None, e.next_due_at or 0))
        for e in shown[:ENTRY_SERIES_MAX]:
            runs.add_metric([e.name], e.runs)
            last.add_metric([e.name], e.last_run_at or 0.0)
            if e.next_due_at is not None:
                due.add_metric([e.name], e.next_due_at)
        yield from (runs, last, due)

    def _lease(self, health: Any) -> Iterator[Metric]:
        held, fence = family("schedproj_lease_held_seconds"), family("schedproj_lease_fence")
        if health.lease is not None:
            held.add_metric([health.lease.holder], health.lease.held_s)
            fence.add_metric([], health.lease.fence)
        else:
            held.add_metric([""], 0.0)
            fence.add_metric([], 0)
        yield held
        yield fence
        over = family("schedproj_lease_over_hold_cap")
        over.add_metric([], int(health.lease_over_cap))
        yield over
        depth = family("schedproj_deferral_chain_depth")
        depth.add_metric([], health.chain_depth)
        yield depth
        undispatched = family("schedproj_undispatched_lanes")
        undispatched.add_metric([], len(health.undispatched))
        yield undispatched
        posture = family("schedproj_posture")
        for name in ("healthy", "degraded", "unknown"):
            posture.add_metric([name], int(health.posture.value == name))
        yield posture

    def _families(self, health: Any, obs: Observation) -> Iterator[Metric]:
        """Per-family aggregates: members, due, deferred, running, the worst ratio."""
        out = {name: family(f"schedproj_family_{name}") for name in
               ("members", "due", "deferred", "running", "max_staleness_ratio")}
        for f in families_folded(obs, health):
            for name, value in (("members", f.members), ("due", f.due),
                                ("deferred", f.deferred), ("running", f.running),
                                ("max_staleness_ratio", f.max_ratio)):
                out[name].add_metric([f.family], value)
        yield from out.values()

    def _member(self, lane: str, obs: Observation) -> bool:
        """Is ``lane`` a family member whose own series are left out (the default)?"""
        if self.settings.metrics_per_member:
            return False
        parts = split_member(lane)
        return parts is not None and parts[0] in obs.families

    def _lanes(self, health: Any, obs: Observation) -> Iterator[Metric]:
        ratio, deferred, backlog, fires, runs, failures, dispatches = (
            family(name) for name in (
                "schedproj_lane_staleness_ratio", "schedproj_lane_deferred_seconds",
                "schedproj_lane_backlog", "schedproj_lane_next_fire_timestamp_seconds",
                "schedproj_lane_runs", "schedproj_lane_failures", "schedproj_dispatches"))
        for h in health.lanes:
            if self._member(h.name, obs):
                continue
            ratio.add_metric([h.name], h.ratio)
            deferred.add_metric([h.name, h.deferral_reason or ""], h.deferred_for_s or 0.0)
            backlog.add_metric([h.name], h.backlog)
            at = next_fire(obs, h)["next_fire_at"]
            if at is not None:
                fires.add_metric([h.name], at)
            runs.add_metric([h.name], h.runs)
            failures.add_metric([h.name], h.failures)
            dispatches.add_metric([h.name, h.queue], h.dispatches)
        yield from (ratio, deferred, backlog, fires, runs, failures, dispatches)

    def _counters(self, counters: dict[str, int], acquisitions: int,
                  obs: Observation) -> Iterator[Metric]:
        families = {kind: family(name) for kind, name in COUNTERS.items()}
        totals: dict[tuple[CounterKind, str], int] = {}
        for field, value in counters.items():
            parsed = parse_counter_field(field)
            if parsed is None:
                continue
            kind, label = parsed
            if self._member(label, obs):
                # Counted under the family's name: one series per family, not per member.
                label = (split_member(label) or (label,))[0]
            totals[(kind, label)] = totals.get((kind, label), 0) + value
        for (kind, label), value in totals.items():
            families[kind].add_metric([label], value)
        yield from families.values()
        leases = family(f"schedproj_{LEASE_ACQUISITIONS}")
        leases.add_metric([], acquisitions)
        yield leases

    def _pools(self, health: Any, obs: Observation) -> Iterator[Metric]:
        """Every pool, the default one too: slots, busy slots, each slot's hold, waiters and
        grants (one series per slot, so a pool's series are bounded by its slot count)."""
        slots, busy, held, fence, waiting, grants = (family(name) for name in (
            "schedproj_pool_slots", "schedproj_pool_slots_busy",
            "schedproj_pool_slot_held_seconds", "schedproj_pool_slot_fence",
            "schedproj_pool_waiting", "schedproj_pool_acquisitions"))
        for gauge in health.pools:
            slots.add_metric([gauge.pool], gauge.slots)
            busy.add_metric([gauge.pool], gauge.busy)
            holds = {h.slot: h for h in gauge.holders}
            for i in range(gauge.slots):
                h = holds.get(i)
                held.add_metric([gauge.pool, str(i)], h.held_s if h else 0.0)
                fence.add_metric([gauge.pool, str(i)], h.fence if h else 0)
            waiting.add_metric([gauge.pool], gauge.waiting)
            grants.add_metric([gauge.pool], obs.lease_acquisitions if gauge.pool == DEFAULT_POOL
                              else obs.counters.get(pool_acquisitions(gauge.pool), 0))
        yield from (slots, busy, held, fence, waiting, grants)

    def _pressure(self, obs: Observation) -> Iterator[Metric]:
        """The waiting heavy lane pressing on the lease (beat's last measure), the last run
        that yielded to pressure, and how many did."""
        ratio = family("schedproj_pressure_ratio")
        p = obs.pressure
        ratio.add_metric([p.lane if p else ""], p.ratio(obs.now) if p else 0.0)
        yield ratio
        last = family("schedproj_last_pressure_yield_timestamp_seconds")
        y = obs.last_pressure_yield
        last.add_metric([y.lane if y else "", y.pressing if y else ""], y.at if y else 0.0)
        yield last
        count = family("schedproj_pressure_yields")
        count.add_metric([], obs.pressure_yields)
        yield count


_served: set[tuple[str, int]] = set()


def serve(client: redis.Redis, keys: Keys, settings: Settings,
          specs: tuple[LaneSpec, ...],
          families: list[dict[str, Any]] | None = None) -> CollectorRegistry | None:
    """Start the HTTP endpoint if ``SCHEDPROJ_METRICS_PORT`` is set (once per process):
    ``/metrics`` as before, and the status page (``/``) with its JSON (``/api/...``)."""
    if settings.metrics_port is None:
        return None
    registry = CollectorRegistry()
    registry.register(SchedprojCollector(client, keys, settings, specs, families))
    where = (settings.metrics_host, settings.metrics_port)
    if where not in _served:
        from schedproj.telemetry.webserver import start

        server = start(registry, client, keys, settings, specs)
        _served.add(where)
        host, port = server.server_address[:2]
        logger.info("metrics on http://%s:%d/metrics, status page on http://%s:%d/",
                    host, port, host, port)
    return registry
