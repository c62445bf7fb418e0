"""A bare Celery beat sending the throughput scenario's light tasks (the comparison peer).

``celery -A bench.bare_app beat -S celery.beat:PersistentScheduler``: Celery's own scheduler,
each light lane's plain twin task (same body, no lane) as a ``beat_schedule`` entry due
every ``BENCH_BARE_INTERVAL_S`` (default 1 ms, i.e. always due), sent to queue ``light``. The
same ``worker -Q light`` runs
them, so only the scheduler differs from the FairScheduler run.
"""

from __future__ import annotations

import os

from bench import lanes
from schedproj.app import app
from schedproj.core import defaults

INTERVAL_S = float(os.environ.get("BENCH_BARE_INTERVAL_S", "0.001"))

app.conf.beat_schedule = {
    name: {"task": lanes.bare_name(name), "schedule": INTERVAL_S,
           "options": {"queue": defaults.LIGHT_QUEUE}}
    for name in lanes.light_names()
}

__all__ = ["app"]
