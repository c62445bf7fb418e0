#!/usr/bin/env bash
# The heavy worker: one slot, queue "heavy". Scale by running more of these (on any host):
# the lease keeps heavy runs exclusive fleet-wide. APP defaults to schedproj.app.
# Used as is by compose (compose/docker-compose.yml) and by a bare-metal deploy; its node is
# heavy@<host>, so `celery -A schedproj.app inspect ping -d heavy@<host>` checks its health.
# Extra arguments are passed through to `celery worker`.
exec celery -A "${SCHEDPROJ_APP:-schedproj.app}" worker -Q heavy -c 1 -n "heavy@%h" \
  --without-gossip --without-mingle -l "${LOGLEVEL:-info}" "$@"
