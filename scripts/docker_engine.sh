#!/usr/bin/env bash
# A Docker engine for the compose test, started only if none answers, and stopped only by
# those who use the one this script started:
#
#   bash scripts/docker_engine.sh start   # exit 0: an engine answers; stdout says whose:
#                                         #   "started" (this call started dockerd),
#                                         #   "joined" (a dockerd this script started earlier),
#                                         #   "running" (someone else's engine: never stopped);
#                                         # exit 3: none can be started (the reason on stderr)
#   bash scripts/docker_engine.sh stop    # after "started" or "joined": the last user out
#                                         # stops the dockerd this script started
#   bash scripts/docker_engine.sh stop --if-idle   # stop it whatever the count, unless a
#                                                  # container still runs (CI's exit trap)
#
# Several test runs may share one engine (two sessions on one machine), so users are counted
# under a lock. The engine is started with --iptables=false --bridge=none: it adds no bridge, no
# iptables rule and no route, so the host's network stays exactly as it was (other tests build
# network namespaces of their own). Containers then run with host networking on loopback ports.
set -uo pipefail

STATE=${SCHEDPROJ_DOCKERD_STATE:-/run/schedproj-dockerd}
PIDFILE=$STATE/dockerd.pid
USERS=$STATE/users
LOG=$STATE/dockerd.log

log() { echo "docker_engine: $*" >&2; }
answers() { timeout 10 docker info >/dev/null 2>&1; }
ours() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }
users() { cat "$USERS" 2>/dev/null || echo 0; }

start() {
  if ! command -v docker >/dev/null 2>&1; then
    log "no docker command (install docker.io: bash scripts/setup.sh)"; return 3
  fi
  if ours && answers; then
    echo $(( $(users) + 1 )) > "$USERS"
    log "joined the dockerd this script started (pid $(cat "$PIDFILE"), $(users) users)"
    echo joined; return 0
  fi
  if answers; then
    log "a Docker engine already answers; leaving it alone"; echo running; return 0
  fi
  if ! command -v dockerd >/dev/null 2>&1; then
    log "no Docker engine answers and dockerd is not installed"; return 3
  fi
  if [ "$(id -u)" != 0 ]; then
    log "no Docker engine answers and starting dockerd needs root"; return 3
  fi
  # Its own process group (setsid), so `stop` ends it and nothing else.
  setsid dockerd --iptables=false --ip6tables=false --ip-masq=false --bridge=none \
    --host unix:///var/run/docker.sock >"$LOG" 2>&1 < /dev/null 9>&- &
  echo $! > "$PIDFILE"
  echo 1 > "$USERS"
  for _ in $(seq 1 60); do
    answers && { log "started dockerd (pid $(cat "$PIDFILE"), log $LOG)"; echo started; return 0; }
    kill -0 "$(cat "$PIDFILE")" 2>/dev/null || break
    sleep 0.5
  done
  log "dockerd did not come up:"; tail -n 20 "$LOG" >&2
  halt
  return 3
}

halt() {
  local pid
  pid=$(cat "$PIDFILE")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then
      log "dockerd (pid $pid) ignored SIGTERM for 30 s; SIGKILL"; kill -KILL "$pid"
    fi
    log "stopped dockerd (pid $pid)"
  fi
  rm -f "$PIDFILE" "$USERS"
}

stop() {
  [ -f "$PIDFILE" ] || { log "did not start a dockerd; nothing to stop"; return 0; }
  if [ "${1:-}" = "--if-idle" ]; then
    if [ -n "$(timeout 10 docker ps -q 2>/dev/null)" ]; then
      log "containers still run on the dockerd this script started; leaving it up"; return 0
    fi
  else
    local left=$(( $(users) - 1 ))
    if [ "$left" -gt 0 ]; then
      echo "$left" > "$USERS"
      log "dockerd still used by $left other run(s); leaving it up"; return 0
    fi
  fi
  halt
}

mkdir -p "$STATE"
exec 9>"$STATE/lock"
flock 9
case "${1:-}" in
  start) start ;;
  stop) stop "${2:-}" ;;
  *) echo "usage: $0 start | stop [--if-idle]" >&2; exit 2 ;;
esac
