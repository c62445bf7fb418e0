#!/usr/bin/env bash
# Build a local stand-in for the public python:3.11-slim image, for machines that cannot reach
# Docker Hub (the compose test in CI): a Debian bookworm minbase root made with debootstrap
# from the Debian mirror this machine's apt already uses, with Python 3.11, pip and
# redis-server (the test's Redis service runs it too), then `docker import`ed.
#
#   bash scripts/docker_base.sh            # prints the image tag; builds only if missing
#   BASE_IMAGE=tag bash scripts/docker_base.sh --force
#
# Nothing machine-specific is written to the repository: the mirror is read from
# /etc/apt/sources.list* when this runs, and the host's CA bundle is copied into the root so
# that pip inside `docker build` trusts what the host trusts. The image is labelled with a hash
# of this script; a later run reuses it while the label matches (Docker keeps it between runs).
# Real users need none of this: compose/Dockerfile defaults to the public python image.
set -euo pipefail
cd "$(dirname "$0")/.."

TAG=${BASE_IMAGE:-schedproj-test-base:bookworm}
SUITE=bookworm
PACKAGES=ca-certificates,python3,python3-pip,python-is-python3,redis-server
KEY=$(cat "$0" | sha256sum | cut -c1-16)
LABEL=org.schedproj.base-key

log() { echo "docker_base: $*" >&2; }

# One build at a time (test runs may share an engine); a second waits, then finds it built.
exec 8>"${TMPDIR:-/tmp}/schedproj-docker-base.lock"
flock 8

if [ "${1:-}" != "--force" ] \
    && [ "$(docker image inspect -f "{{ index .Config.Labels \"$LABEL\" }}" "$TAG" 2>/dev/null)" = "$KEY" ]; then
  log "$TAG is up to date (key $KEY)"
  echo "$TAG"
  exit 0
fi

# The first Debian main archive among apt's sources that serves $SUITE (not -security,
# -updates). deb822 (*.sources) and one-line (*.list) formats.
mirror() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -r "$f" ] || continue
    awk -v suite="$SUITE" '
      function flush() { if (uris != "" && (" " suites " ") ~ (" " suite " ")) { split(uris, u, " "); print u[1]; exit } uris = ""; suites = "" }
      /^[ \t]*$/ { flush(); next }
      /^URIs:/ { sub(/^URIs:[ \t]*/, ""); uris = $0 }
      /^Suites:/ { sub(/^Suites:[ \t]*/, ""); suites = $0 }
      END { flush() }' "$f"
  done
  cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
    | awk -v suite="$SUITE" '$1 == "deb" { i = 2; if ($2 ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
                                           if ($(i + 1) == suite) { print $i } }'
}
MIRROR=$(mirror | grep -v -- '-security' | head -n1 || true)
[ -n "$MIRROR" ] || { log "no Debian $SUITE archive among apt's sources"; exit 1; }

WORK=$(mktemp -d /var/tmp/schedproj-base.XXXXXX)
ROOT=$WORK/root
cleanup() {
  for m in dev/pts dev proc sys; do umount -l "$ROOT/$m" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

started=$(date +%s)
log "debootstrap --variant=minbase $SUITE (apt's mirror)"
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOT" "$MIRROR" \
  > "$WORK/debootstrap.log" 2>&1 || { tail -n 30 "$WORK/debootstrap.log" >&2; exit 1; }

# The host's CA bundle, so pip inside `docker build` trusts what this host trusts.
cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/ca-certificates.crt"
# Like python:3.11-slim: `pip install` as root installs into /usr/local, no PEP 668 refusal.
rm -f "$ROOT"/usr/lib/python3*/EXTERNALLY-MANAGED
# No apt sources, lists or caches in the image: it is only ever a base for `docker build`.
rm -rf "$ROOT/etc/apt/sources.list" "$ROOT"/etc/apt/sources.list.d/* \
  "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/archives/*.deb "$ROOT/debootstrap"
# redis-server's package starts nothing in a chroot; its data goes to the working directory.
mkdir -p "$ROOT/data"

old_id=$(docker image inspect -f '{{.Id}}' "$TAG" 2>/dev/null || true)
log "docker import as $TAG"
tar -C "$ROOT" -c . | docker import \
  --change "LABEL $LABEL=$KEY" \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
  --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
  --change 'ENV PIP_BREAK_SYSTEM_PACKAGES=1' \
  --change 'CMD ["python3"]' \
  - "$TAG" >/dev/null
# The image this one replaces (an older key) would otherwise linger untagged.
if [ -n "$old_id" ] && [ "$old_id" != "$(docker image inspect -f '{{.Id}}' "$TAG")" ]; then
  docker rmi "$old_id" >/dev/null 2>&1 || true
fi
log "built $TAG in $(( $(date +%s) - started )) s"
echo "$TAG"
