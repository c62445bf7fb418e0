"""Every default in one place, each named with its unit.

The figures for the original system come from DESIGN.md section 4.
"""

from __future__ import annotations

#: Name of the queue heavy (lease-taking) lanes are sent to; served by ``worker -Q heavy -c 1``.
HEAVY_QUEUE = "heavy"
#: Name of the queue light lanes are sent to; served by ``worker -Q light`` at any concurrency.
LIGHT_QUEUE = "light"

#: Prefix of every Redis key schedproj writes, so several deployments can share one Redis.
KEY_PREFIX = "schedproj"

#: Renewable time-to-live of the heavy lease while a run holds it. A SIGKILLed holder stops
#: renewing, so the lease frees itself within this many seconds.
LEASE_TTL_S = 20.0
#: How long a granted lease waits for its heavy message to start. Past it the lease lapses and
#: the message expires, so a missing heavy worker cannot wedge the lease.
START_DEADLINE_S = 60.0
#: After holding the lease this long a heavy run is told to yield at its next checkpoint.
HOLD_CAP_S = 30 * 60.0
#: A heavy run also yields before the hold cap when a waiting heavy lane presses (the rule's
#: defaults: ``core.pressure.DEFAULT_TARGET_RATIO`` and ``DEFAULT_MIN_HOLD_S``). Beat and the
#: simulator both start from this.
PRESSURE_YIELD = True
#: After Redis lost state, no heavy lease is granted for this many lease TTLs: a TTL, plus the
#: renewal interval (a third of it) in which a running holder re-asserts its lease.
QUARANTINE_TTL_RATIO = 4 / 3
#: Backstop: the lease is never renewed past this total hold (the original's 6 h TTL).
MAX_HOLD_S = 6 * 3600.0

#: Time-to-live of the single-active-beat lock; a standby beat takes over this long after the
#: active one dies.
BEAT_LOCK_TTL_S = 15.0
#: Longest a beat sleeps between ticks (it is also woken at once when a run finishes).
BEAT_MAX_LOOP_INTERVAL_S = 3.0
#: The lock must outlive this many loop intervals, so one slow tick never loses it.
BEAT_LOCK_MIN_LOOP_RATIO = 3.0
#: Shortest a beat sleeps (seconds) after a tick that sent nothing, however soon a lane looks
#: due: state that reads as "due now" yet never dispatches cannot spin beat (a finishing run
#: still wakes it at once).
BEAT_IDLE_SLEEP_FLOOR_S = 0.1

#: A lane's last_run_at (the worker's clock) up to this many seconds in the future (and at most
#: one cadence) is taken as it is: a run that ended while the tick was reading, host jitter.
#: Further ahead, beat's own dispatch time plus one cadence caps it, so a host whose clock is
#: ahead never delays a lane by more than one cadence.
CLOCK_SKEW_TOLERANCE_S = 1.0

#: Declared order given to lanes that name none: after every lane that does.
DEFAULT_LANE_ORDER = 1000

#: Hard time limit of a heavy run (seconds); must be below the broker's visibility timeout.
HEAVY_TIME_LIMIT_S = 2 * 3600.0
#: Redis broker visibility timeout (seconds): an unacked message is redelivered after this.
VISIBILITY_TIMEOUT_S = 3 * 3600.0
#: RabbitMQ's default consumer_timeout (seconds; 30 min): a delivery not acknowledged by then
#: closes the consumer's channel and is redelivered. Every hard time limit must stay below it.
RABBITMQ_CONSUMER_TIMEOUT_S = 30 * 60.0
#: Hard time limit of a light run (seconds). It bounds how long a run may count as in flight.
LIGHT_TIME_LIMIT_S = 15 * 60.0

#: Format version written into every JSON value schedproj stores in Redis.
STATE_VERSION = 1

#: Entries kept in the run journal and the dispatch log (each a Redis list, oldest dropped).
AUDIT_LOG_LEN = 20_000
