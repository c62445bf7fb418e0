#!/usr/bin/env bash
# The heavy worker: one slot, queue "heavy". Scale by running more of these (on any host):
# the lease keeps heavy runs exclusive fleet-wide. APP defaults to schedproj.app.
exec celery -A "${SCHEDPROJ_APP:-schedproj.app}" worker -Q heavy -c 1 -n "heavy@%h" \
  --without-gossip --without-mingle -l "${LOGLEVEL:-info}" "$@"
