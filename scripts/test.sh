#!/usr/bin/env bash
# Runs every test of the workspace. Starts what the tests need and is missing: the local
# Postgres, Redis and NATS (when installed but stopped) and an S3-compatible server (s3s-fs,
# installed on first use). Safe to run repeatedly.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[test] %s\n' "$*" >&2; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

ensure_service() {
  local name=$1 port=$2; shift 2
  if port_open "$port"; then return 0; fi
  log "$name is not answering on $port; starting it"
  "$@" || log "could not start $name (tests that need it will fail)"
  for _ in $(seq 1 50); do port_open "$port" && return 0; sleep 0.2; done
  log "$name still not answering on $port"
}

if command -v pg_ctlcluster >/dev/null 2>&1; then
  ensure_service postgres 5432 bash -c 'pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start'
fi
if command -v redis-server >/dev/null 2>&1; then
  ensure_service redis 6379 redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no
fi
if command -v nats-server >/dev/null 2>&1; then
  ensure_service nats 4222 bash -c 'nohup nats-server -a 127.0.0.1 -p 4222 -js -sd "${TMPDIR:-/tmp}/switchyard-nats" >/dev/null 2>&1 &'
fi

# S3-compatible server on loopback; the script prints the variables the tests read.
eval "$(scripts/start-s3.sh)"

export SWITCHYARD_TEST_POSTGRES_URL="${SWITCHYARD_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}"
export SWITCHYARD_TEST_REDIS_URL="${SWITCHYARD_TEST_REDIS_URL:-redis://127.0.0.1:6379}"
export SWITCHYARD_TEST_NATS_URL="${SWITCHYARD_TEST_NATS_URL:-nats://127.0.0.1:4222}"

# The console's browser test drives Debian's headless Chromium (tests/tests/console_browser.rs):
# installed here; once it is, the test fails rather than skips when it cannot start a browser.
if scripts/install-browser.sh; then
  export SWITCHYARD_REQUIRE_BROWSER=1
else
  log "chromium could not be installed: the console browser test will skip"
fi

# The multi-pod and embedded-binary scenarios run the real `switchyard` binary: build it from
# this checkout first so a reused target directory never serves a stale one.
cargo build --workspace --all-features --bins
# The scenarios also build the binaries they run exactly like this (tests/src/lib.rs), and a
# single-package build unifies dependency features differently from the workspace build:
# build them here, once, so no test holds the cargo lock for minutes while others wait.
cargo build -p switchyard --bin switchyard
cargo build -p switchyard-host-agent --bin switchyard-host

if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --all-features --no-fail-fast "$@"
else
  cargo test --workspace --all-features --no-fail-fast "$@"
fi
