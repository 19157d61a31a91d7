#!/usr/bin/env bash
# Installs (once) and starts a local S3-compatible server for tests: s3s-fs, which keeps
# objects as files and checks SigV4 signatures against one fixed test key.
#
#   eval "$(scripts/start-s3.sh)"     # then: cargo test -p switchyard-files-s3
#
# Idempotent: skips the install when the binary exists and the start when something already
# answers on the port. Progress goes to stderr; stdout carries only the `export` lines.
#
# Environment:
#   SWITCHYARD_TOOLS_DIR     where the binary is installed (default ~/.cache/switchyard/tools)
#   SWITCHYARD_TEST_S3_PORT  port on 127.0.0.1 (default 9100)
set -euo pipefail

S3S_FS_VERSION=0.14.1
TOOLS=${SWITCHYARD_TOOLS_DIR:-$HOME/.cache/switchyard/tools}
PORT=${SWITCHYARD_TEST_S3_PORT:-9100}
BIN="$TOOLS/bin/s3s-fs"
DATA="${TMPDIR:-/tmp}/switchyard-s3-$PORT"
LOG="$DATA.log"
# Test-only credentials; the server accepts exactly this pair.
ACCESS_KEY=switchyard-test
SECRET_KEY=switchyard-test-secret
REGION=us-east-1

log() { echo "start-s3: $*" >&2; }

answers() {
    # bash's /dev/tcp keeps this free of curl/nc; the subshell closes the socket again.
    (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null
}

if [[ ! -x "$BIN" ]]; then
    log "installing s3s-fs $S3S_FS_VERSION into $TOOLS (first run only; takes a few minutes)"
    cargo install "s3s-fs@$S3S_FS_VERSION" --locked --features binary --root "$TOOLS" >&2
fi

# A server an earlier run left behind answers but fails every request once the directory it
# was started from is gone (a removed checkout: s3s-fs resolves paths against it). Replace it.
if answers && [[ -f "$DATA.pid" ]]; then
    old=$(cat "$DATA.pid")
    if kill -0 "$old" 2>/dev/null && [[ "$(readlink "/proc/$old/cwd" 2>/dev/null)" == *" (deleted)" ]]; then
        log "the S3 server on 127.0.0.1:$PORT (pid $old) lost its working directory; restarting it"
        kill "$old" 2>/dev/null || true
        for _ in $(seq 1 50); do
            answers || break
            sleep 0.1
        done
    fi
fi

if answers; then
    log "something already answers on 127.0.0.1:$PORT; assuming it is the test S3 server"
else
    mkdir -p "$DATA"
    log "starting s3s-fs on 127.0.0.1:$PORT with data in $DATA (log: $LOG)"
    # Detached from this shell and from its stdout, so `eval "$(...)"` returns and the server
    # outlives the script; started from `/`, so removing the checkout that started it does
    # not break it.
    cd /
    RUST_LOG=${RUST_LOG_S3:-warn} setsid "$BIN" \
        --host 127.0.0.1 --port "$PORT" \
        --access-key "$ACCESS_KEY" --secret-key "$SECRET_KEY" \
        "$DATA" </dev/null >"$LOG" 2>&1 &
    pid=$!
    echo "$pid" >"$DATA.pid"
    for _ in $(seq 1 100); do
        if answers; then
            break
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
            log "s3s-fs exited during startup; its log:"
            tail -n 40 "$LOG" >&2 || true
            exit 1
        fi
        sleep 0.1
    done
    if ! answers; then
        log "s3s-fs did not answer on 127.0.0.1:$PORT within 10s; its log:"
        tail -n 40 "$LOG" >&2 || true
        exit 1
    fi
    log "s3s-fs is up (pid $pid)"
fi

echo "export SWITCHYARD_TEST_S3_ENDPOINT=http://127.0.0.1:$PORT"
echo "export AWS_ACCESS_KEY_ID=$ACCESS_KEY"
echo "export AWS_SECRET_ACCESS_KEY=$SECRET_KEY"
echo "export AWS_REGION=$REGION"
