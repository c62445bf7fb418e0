"""The exporter's catalog (``schedproj.telemetry.metrics.CATALOG``) is what a scrape serves:
every family it yields is catalogued with the same type, help and labels, and every catalogued
metric is yielded. The alert-rule test and the docs' metrics reference read the catalog, so
this is what keeps them true."""

from __future__ import annotations

import redis

from schedproj.core.lanes import LaneKind, LaneSpec
from schedproj.settings import Settings
from schedproj.store.protocol import CounterKind, Keys, counter_field
from schedproj.telemetry.metrics import CATALOG, SchedprojCollector


def test_a_scrape_serves_exactly_the_catalog(client: redis.Redis, keys: Keys) -> None:
    specs = (LaneSpec(name="big", task_name="big", kind=LaneKind.HEAVY, cadence_s=60.0),
             LaneSpec(name="small", task_name="small", kind=LaneKind.LIGHT, cadence_s=60.0))
    # A counter of every kind, so each counter family has a sample with its label.
    for kind in CounterKind:
        client.hincrby(keys.counters, counter_field(kind, "big"), 1)
    served = list(SchedprojCollector(client, keys, Settings(), specs).collect())
    assert [(m.name, m.type, m.documentation) for m in served] == [
        (d.name, d.kind, d.help) for d in CATALOG]
    labels = {d.name: set(d.labels) for d in CATALOG}
    for metric in served:
        for sample in metric.samples:
            assert set(sample.labels) == labels[metric.name], (metric.name, sample)
    assert any(m.samples for m in served if m.name == "schedproj_lost_runs"), \
        "the counters written above were not exported"
