#!/usr/bin/env bash
# A throwaway PostgreSQL server for tests: TCP on 127.0.0.1 only, a free port, password (scram) login
# with a generated password, one database. Nothing of it outlives `stop`.
#
#   scripts/postgres.sh start [--install] [STATE_DIR]   start it; print its URL (postgresql://…)
#   scripts/postgres.sh url [STATE_DIR]                 print the URL of the running server
#   scripts/postgres.sh stop [STATE_DIR]                stop it and delete its data
#
# STATE_DIR (default .pg in the repository) holds the URL (mode 600) and where the data lives.
# --install: as root on Debian, `apt-get install postgresql` when no initdb/pg_ctl is found.
# As root the server runs as the `postgres` system user (PostgreSQL refuses to run as root); its data
# goes into STATE_DIR when that user can reach it, else into a fresh directory under $TMPDIR.
# Exit status: 0 started/stopped, 1 could not start (one `note:` line on stderr says why).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cmd=${1:-}
shift || true
install=0
if [ "${1:-}" = "--install" ]; then install=1; shift; fi
STATE=${1:-$ROOT/.pg}
case "$STATE" in /*) ;; *) STATE=$PWD/$STATE ;; esac  # the server's user resolves it too
DB=autotune_test
USER_NAME=autotune

note() { echo "note: PostgreSQL test server: $*" >&2; }

find_bin() {
  local d
  if command -v pg_ctl >/dev/null 2>&1 && command -v initdb >/dev/null 2>&1; then
    # the folder the programs really are in (a link in PATH may point there): createdb is beside them
    dirname "$(readlink -f "$(command -v pg_ctl)")"
    return 0
  fi
  # Debian keeps the server's programs out of PATH, one folder per major version: take the newest
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [ -x "$d/pg_ctl" ] && [ -x "$d/initdb" ] && [ -x "$d/createdb" ]; then echo "$d"; return 0; fi
  done
  return 1
}

# as the server's user: ourselves, or `postgres` when we are root
as_server() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start() {
  local bin base data port password
  if [ -e "$STATE/url" ]; then
    note "already running ($STATE/url); 'scripts/postgres.sh stop' first"
    return 1
  fi
  if ! bin=$(find_bin); then
    if [ "$install" = 1 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null) \
        || { note "apt-get install postgresql failed"; return 1; }
    fi
    bin=$(find_bin) || { note "no initdb/pg_ctl found (install Debian's 'postgresql' package)"; return 1; }
  fi
  if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
    note "running as root and there is no 'postgres' user to run the server as"
    return 1
  fi
  stop  # what a failed start left behind
  mkdir -p "$STATE"
  chmod 711 "$STATE"  # the server's user may pass through to server/; the URL file is 600
  base=$STATE/server
  mkdir -p "$base"
  if [ "$(id -u)" = 0 ]; then chown postgres: "$base"; fi
  if ! as_server test -w "$base"; then  # a parent folder the postgres user cannot enter
    rm -rf "$base"
    base=$(mktemp -d "${TMPDIR:-/tmp}/autotune-pg.XXXXXX")
    if [ "$(id -u)" = 0 ]; then chown postgres: "$base"; fi
  fi
  echo "$base" > "$STATE/base"
  data=$base/data
  password=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
  (umask 077 && echo "$password" > "$base/pwfile")
  if [ "$(id -u)" = 0 ]; then chown postgres: "$base/pwfile"; fi
  if ! as_server "$bin/initdb" -D "$data" -U "$USER_NAME" --pwfile="$base/pwfile" --auth=scram-sha-256 \
    -E UTF8 --locale=C.UTF-8 --no-sync > "$STATE/initdb.log" 2>&1; then
    rm -f "$base/pwfile"
    note "initdb failed (see $STATE/initdb.log)"
    return 1
  fi
  rm -f "$base/pwfile"
  # a test server: TCP only (a socket path under a deep folder can be too long), no fsync (its data is
  # thrown away), room for several workers' connection pools at once
  for attempt in 1 2 3; do
    port=$(free_port)
    if as_server "$bin/pg_ctl" -D "$data" -l "$base/server.log" -w -t 60 -s \
      -o "-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories= -c fsync=off \
          -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" start; then
      break
    fi
    port=""
  done
  if [ -z "$port" ]; then
    note "the server did not start (see $base/server.log)"
    return 1
  fi
  if ! PGPASSWORD=$password "$bin/createdb" -h 127.0.0.1 -p "$port" -U "$USER_NAME" "$DB" 2>"$STATE/createdb.log"; then
    note "createdb failed: $(head -c 300 "$STATE/createdb.log")"
    stop
    return 1
  fi
  (umask 077 && echo "postgresql://$USER_NAME:$password@127.0.0.1:$port/$DB" > "$STATE/url")
  cat "$STATE/url"
}

stop() {
  local bin base
  [ -e "$STATE/base" ] || return 0
  base=$(cat "$STATE/base")
  if [ -e "$base/data/postmaster.pid" ] && bin=$(find_bin); then
    as_server "$bin/pg_ctl" -D "$base/data" -w -t 60 -s -m fast stop || true
  fi
  rm -rf "$base"
  rm -rf "$STATE"
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  url) cat "$STATE/url" ;;
  *) echo "usage: scripts/postgres.sh start [--install] [STATE_DIR] | url [STATE_DIR] | stop [STATE_DIR]" >&2; exit 2 ;;
esac
