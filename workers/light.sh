#!/usr/bin/env bash
# The light worker: queue "light", any concurrency (default: Celery's, one per core).
exec celery -A "${SCHEDPROJ_APP:-schedproj.app}" worker -Q light -n "light@%h" \
  --without-gossip --without-mingle -l "${LOGLEVEL:-info}" "$@"
