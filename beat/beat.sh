#!/usr/bin/env bash
# The fair beat. Run one per deployment; a second one stands by and takes over if it dies.
# Used as is by compose (compose/docker-compose.yml) and by a bare-metal deploy.
#
# Remote control is on and the node is named beat@<host>, so a health check can ask
#   celery -A schedproj.app inspect ping -d beat@<host>
# (Celery >= 5.7: beat answers ping only while its scheduler keeps ticking). Extra arguments
# are passed through to `celery beat` (a later -n overrides the node name).
exec celery -A "${SCHEDPROJ_APP:-schedproj.app}" beat -S fair \
  --enable-remote-control -n "beat@%h" -l "${LOGLEVEL:-info}" "$@"
