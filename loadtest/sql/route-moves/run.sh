#!/usr/bin/env bash
# Route moves a second: the channels table (a move is a non-HOT update touching its indexes)
# against a narrow routes table. Usage: run.sh [postgres url] (default: the test database).
# Drops and recreates schema exp there.
set -euo pipefail
cd "$(dirname "$0")"
url="${1:-postgres://postgres@127.0.0.1:5432/test}"
export PGOPTIONS="-c client_min_messages=warning"
psql -q "$url" -f setup.sql
for table in channels routes; do
  for batch in 32 128; do
    tps=$(pgbench -n -c 4 -j 2 -T 15 --max-tries 20 -D batch="$batch" -f "upd_$table.sql" "$url" 2>/dev/null |
      awk '/^tps/ { print $3 }')
    echo "$table, batches of $batch: $(awk -v t="$tps" -v b="$batch" 'BEGIN { printf "%.0f", t * b }') moves/s"
  done
done
psql "$url" -c "SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE schemaname = 'exp'"
psql -q "$url" -c "DROP SCHEMA exp CASCADE"
