"""Prometheus metrics, served by beat on ``SCHEDPROJ_METRICS_PORT`` (loopback by default).

Every figure is read from Redis at scrape time — lane records, the lease, durable counters — so
the numbers survive restarts of beat and workers and agree with ``schedproj status``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import redis
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from schedproj.keys import Keys
from schedproj.lanes import LaneSpec
from schedproj.observe import observe
from schedproj.settings import Settings

logger = logging.getLogger(__name__)

#: Durable counter hash field prefix -> (metric name, help, label).
COUNTERS = {
    "deferrals": ("schedproj_deferrals", "Deferral streaks begun, by reason.", "reason"),
    "yields": ("schedproj_yields", "Heavy runs that yielded at a checkpoint.", "lane"),
    "skips": ("schedproj_stale_token_refusals",
              "Heavy messages refused for a stale, forged or missing lease token.", "lane"),
    "errors": ("schedproj_scheduling_errors",
               "Scheduling errors (a due-check raised, unreadable state).", "lane"),
}


class SchedprojCollector(Collector):
    """Reads one deployment's durable state on every scrape."""

    def __init__(self, client: redis.Redis, keys: Keys, settings: Settings,
                 specs: tuple[LaneSpec, ...]) -> None:
        self.client, self.keys, self.settings, self.specs = client, keys, settings, specs

    def collect(self) -> Iterator[Metric]:
        try:
            obs = observe(self.client, self.keys, specs=self.specs)
        except redis.RedisError:
            logger.warning("metrics: Redis unreachable; scrape has no schedproj figures")
            up = GaugeMetricFamily("schedproj_state_up", "Redis state readable.")
            up.add_metric([], 0)
            yield up
            return
        s = self.settings
        health = obs.health(starvation_threshold_s=s.starvation_threshold_s,
                            hold_cap_s=s.hold_cap_s, profile=s.profile)
        up = GaugeMetricFamily("schedproj_state_up", "Redis state readable.")
        up.add_metric([], 1)
        yield up
        yield from self._lease(health)
        yield from self._lanes(health)
        yield from self._counters(obs.counters, obs.lease_acquisitions)

    def _lease(self, health: Any) -> Iterator[Metric]:
        held = GaugeMetricFamily("schedproj_lease_held_seconds",
                                 "How long the heavy lease has been held (0: free).",
                                 labels=["lane"])
        fence = GaugeMetricFamily("schedproj_lease_fence", "Fencing number of the held lease.")
        if health.lease is not None:
            held.add_metric([health.lease.holder], health.lease.held_s)
            fence.add_metric([], health.lease.fence)
        else:
            held.add_metric([""], 0.0)
            fence.add_metric([], 0)
        yield held
        yield fence
        over = GaugeMetricFamily("schedproj_lease_over_hold_cap",
                                 "1 while the lease is held past the hold cap.")
        over.add_metric([], int(health.lease_over_cap))
        yield over
        depth = GaugeMetricFamily("schedproj_deferral_chain_depth",
                                  "Longest chain of lanes deferred behind one another.")
        depth.add_metric([], health.chain_depth)
        yield depth
        posture = GaugeMetricFamily("schedproj_posture", "Watchdog posture (1 = current).",
                                    labels=["posture"])
        for name in ("healthy", "degraded", "unknown"):
            posture.add_metric([name], int(health.posture.value == name))
        yield posture

    def _lanes(self, health: Any) -> Iterator[Metric]:
        ratio = GaugeMetricFamily("schedproj_lane_staleness_ratio",
                                  "(now - last run) / cadence; +Inf if never run.",
                                  labels=["lane"])
        deferred = GaugeMetricFamily("schedproj_lane_deferred_seconds",
                                     "Age of the lane's current deferral streak (0: none).",
                                     labels=["lane", "reason"])
        backlog = GaugeMetricFamily("schedproj_lane_backlog", "Backlog the lane reported.",
                                    labels=["lane"])
        runs = CounterMetricFamily("schedproj_lane_runs", "Finished runs.", labels=["lane"])
        failures = CounterMetricFamily("schedproj_lane_failures", "Failed runs.",
                                       labels=["lane"])
        dispatches = CounterMetricFamily("schedproj_dispatches", "Messages sent by beat.",
                                         labels=["lane", "queue"])
        for h in health.lanes:
            ratio.add_metric([h.name], h.ratio)
            deferred.add_metric([h.name, h.deferral_reason or ""], h.deferred_for_s or 0.0)
            backlog.add_metric([h.name], h.backlog)
            runs.add_metric([h.name], h.runs)
            failures.add_metric([h.name], h.failures)
            dispatches.add_metric([h.name, h.queue], h.dispatches)
        yield from (ratio, deferred, backlog, runs, failures, dispatches)

    def _counters(self, counters: dict[str, int], acquisitions: int) -> Iterator[Metric]:
        families = {kind: CounterMetricFamily(name, doc, labels=[label])
                    for kind, (name, doc, label) in COUNTERS.items()}
        for field, value in counters.items():
            kind, _, label = field.partition("|")
            if kind in families:
                families[kind].add_metric([label], value)
        yield from families.values()
        leases = CounterMetricFamily("schedproj_lease_acquisitions",
                                     "Heavy lease grants (the fencing counter).")
        leases.add_metric([], acquisitions)
        yield leases


_served: set[tuple[str, int]] = set()


def serve(client: redis.Redis, keys: Keys, settings: Settings,
          specs: tuple[LaneSpec, ...]) -> CollectorRegistry | None:
    """Start the metrics endpoint if ``SCHEDPROJ_METRICS_PORT`` is set (once per process)."""
    if settings.metrics_port is None:
        return None
    registry = CollectorRegistry()
    registry.register(SchedprojCollector(client, keys, settings, specs))
    where = (settings.metrics_host, settings.metrics_port)
    if where not in _served:
        start_http_server(settings.metrics_port, addr=settings.metrics_host, registry=registry)
        _served.add(where)
        logger.info("metrics on http://%s:%d/metrics", *where)
    return registry
