#!/usr/bin/env bash
# The fair beat. Run one per deployment; a second one stands by and takes over if it dies.
exec celery -A "${SCHEDPROJ_APP:-schedproj.app}" beat -S fair -l "${LOGLEVEL:-info}" "$@"
