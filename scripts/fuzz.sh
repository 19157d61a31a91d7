#!/usr/bin/env bash
# Fuzz targets of the parsers of untrusted input (fuzz/README.md).
#
#   scripts/fuzz.sh replay          builds the targets (no sanitizer, stable toolchain) and runs
#                                   every input of fuzz/corpus/TARGET once; what .ci/run does
#   scripts/fuzz.sh run [SECONDS]   a campaign: each target for SECONDS (default 60) under
#                                   cargo-fuzz with AddressSanitizer (RUSTC_BOOTSTRAP=1 on
#                                   stable; installs cargo-fuzz on first use), new inputs kept
#                                   in fuzz/corpus/TARGET, crashes in fuzz/artifacts/TARGET
#   scripts/fuzz.sh run SECONDS T   one target only
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/switchyard/target}"
TARGETS=(packet host_message webhook_json webhook_multipart telegram_update config)

case "${1:-replay}" in
replay)
  cargo build --manifest-path fuzz/Cargo.toml --bins
  for t in "${TARGETS[@]}"; do
    n=$(find "fuzz/corpus/$t" -type f | wc -l)
    echo "[fuzz] $t: replaying $n inputs"
    # -runs=0 runs every corpus input once and exits; a crash or failed assert exits non-zero.
    "$CARGO_TARGET_DIR/debug/$t" -runs=0 "fuzz/corpus/$t" 2>&1 | tail -n 2
    test "${PIPESTATUS[0]}" -eq 0
  done
  ;;
run)
  secs=${2:-60}
  only=${3:-}
  if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
  fi
  export RUSTC_BOOTSTRAP=1
  for t in "${TARGETS[@]}"; do
    [ -n "$only" ] && [ "$t" != "$only" ] && continue
    echo "[fuzz] $t: ${secs}s"
    # cargo-fuzz keeps its own target dir under fuzz/ (sanitizer flags differ from CI's).
    log="fuzz/last-$t.log"
    rc=0
    (cd fuzz && CARGO_TARGET_DIR=target cargo fuzz run "$t" "corpus/$t" -- \
      -max_total_time="$secs" -max_len=65536 -print_final_stats=1) >"$log" 2>&1 || rc=$?
    grep -E 'stat::number_of_executed_units|stat::peak_rss_mb|SUMMARY|panicked' "$log" || true
    if [ "$rc" -ne 0 ]; then
      echo "[fuzz] $t failed (exit $rc); see $log and fuzz/artifacts/$t"
      exit "$rc"
    fi
  done
  ;;
*)
  sed -n '2,12p' "$0"
  exit 2
  ;;
esac
