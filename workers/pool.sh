#!/usr/bin/env bash
# A pool's worker: `workers/pool.sh POOL SLOTS [celery worker arguments]`, for a pool declared
# with SCHEDPROJ_POOLS (gpu=2) or configure_app(app, pools=[Pool("gpu", slots=2)]). It serves
# the pool's queue (named after the pool) with as many processes as the pool has slots: the
# slot leases keep the pool at SLOTS runs however many of these run. Used as is by compose
# (the gpu service of compose/docker-compose.yml) and by a bare-metal deploy; its node is
# POOL@<host>, so `celery -A schedproj.app inspect ping -d gpu@<host>` checks its health.
# Extra arguments are passed through to `celery worker`. APP defaults to schedproj.app.
pool="${1:?usage: workers/pool.sh POOL SLOTS [celery worker arguments], e.g. workers/pool.sh gpu 2}"
slots="${2:?usage: workers/pool.sh POOL SLOTS: give the pool its slot count, e.g. workers/pool.sh gpu 2}"
shift 2
exec celery -A "${SCHEDPROJ_APP:-schedproj.app}" worker -Q "$pool" -c "$slots" -n "$pool@%h" \
  --prefetch-multiplier 1 --without-gossip --without-mingle -l "${LOGLEVEL:-info}" "$@"
