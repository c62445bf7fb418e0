"""The exporter's catalog (``schedproj.telemetry.metrics.CATALOG``) is what a scrape serves:
every family it yields is catalogued with the same type, help and labels, and every catalogued
metric is yielded. The alert-rule test and the docs' metrics reference read the catalog, so
this is what keeps them true."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from schedproj.core import codec
from schedproj.core.lanes import LaneKind, LaneSpec
from schedproj.core.laneset import REGISTRY_VERSION
from schedproj.settings import Settings
from schedproj.store.lease import HeavyLease
from schedproj.store.protocol import CounterKind, Keys, counter_field, pool_acquisitions
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


def test_each_pool_and_slot_is_exported_and_the_exposition_passes_promtool(
        client: redis.Redis, keys: Keys) -> None:
    specs = (LaneSpec(name="big", task_name="big", kind=LaneKind.HEAVY, cadence_s=60.0),
             LaneSpec(name="embed", task_name="embed", kind=LaneKind.HEAVY, cadence_s=60.0,
                      pool="gpu"),
             LaneSpec(name="train", task_name="train", kind=LaneKind.HEAVY, cadence_s=60.0,
                      pool="gpu"))
    # What a beat with a pool gpu of two slots publishes; embed holds slot 1 since 30 s.
    client.set(keys.published_lanes, codec.dumps(
        {"profile": "local", "lanes": [], "families": [], "pools": {"gpu": 2, "heavy": 1}},
        REGISTRY_VERSION))
    slot = HeavyLease(client, keys.slot("gpu", 1))
    grant = slot.acquire("embed", "tok", 60.0, time.time() - 30, task_id="run-1")
    assert grant.granted
    client.hincrby(keys.counters, pool_acquisitions("gpu"), 3)
    registry = CollectorRegistry()
    registry.register(SchedprojCollector(client, keys, Settings(), specs))
    text = generate_latest(registry).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for m in text_string_to_metric_families(text) for s in m.samples}
    assert samples[("schedproj_pool_slots", (("pool", "gpu"),))] == 2
    assert samples[("schedproj_pool_slots", (("pool", "heavy"),))] == 1
    assert samples[("schedproj_pool_slots_busy", (("pool", "gpu"),))] == 1
    assert samples[("schedproj_pool_slots_busy", (("pool", "heavy"),))] == 0
    held = samples[("schedproj_pool_slot_held_seconds", (("pool", "gpu"), ("slot", "1")))]
    assert 29 <= held <= 40
    free = ("schedproj_pool_slot_held_seconds", (("pool", "gpu"), ("slot", "0")))
    assert samples[free] == 0
    assert samples[("schedproj_pool_slot_fence", (("pool", "gpu"), ("slot", "1")))] == \
        grant.fence
    # train never ran, so it is due; embed holds a slot, so it does not wait.
    assert samples[("schedproj_pool_waiting", (("pool", "gpu"),))] == 1
    assert samples[("schedproj_pool_waiting", (("pool", "heavy"),))] == 1
    # The grant above counted one, and three more were added.
    assert samples[("schedproj_pool_acquisitions_total", (("pool", "gpu"),))] == 4
    # The lease's own series are as before: the gpu slot is not the lease.
    assert samples[("schedproj_lease_held_seconds", (("lane", ""),))] == 0
    tool = shutil.which("promtool")
    if tool is None:
        pytest.skip("promtool is not installed (Debian package prometheus)")
    checked = subprocess.run([tool, "check", "metrics"], input=text, capture_output=True,
                             text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
