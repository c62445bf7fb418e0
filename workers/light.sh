#!/usr/bin/env bash
# The light worker: queue "light", any concurrency (default: Celery's, one per core; pass -c N).
# Used as is by compose (compose/docker-compose.yml) and by a bare-metal deploy; its node is
# light@<host>, so `celery -A schedproj.app inspect ping -d light@<host>` checks its health.
# Extra arguments are passed through to `celery worker`.
exec celery -A "${SCHEDPROJ_APP:-schedproj.app}" worker -Q light -n "light@%h" \
  --without-gossip --without-mingle -l "${LOGLEVEL:-info}" "$@"
