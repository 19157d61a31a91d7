#!/usr/bin/env bash
# Checks the measurable rules of CODE_STYLE.md on the tracked Rust sources:
#   1. a source file (src/) stays under 800 lines, a test file under 1500: past that it becomes
#      a folder module;
#   2. every file under src/ begins with a module doc (`//!`), but for `main.rs` (thin, the doc
#      is the crate's) and unit-test files (`tests.rs`);
#   3. no `use super::*` outside tests (unit-test modules after `#[cfg(test)]`, `tests.rs`,
#      integration tests);
#   4. the edge names no provider crate outside its factory list and the settings it copies.
# Exceptions live in scripts/style-allow.txt, one `rule path  # reason` per line; an entry that
# no longer matches anything is reported too, so the list only shrinks.
set -euo pipefail
cd "$(dirname "$0")/.."

allow_file=scripts/style-allow.txt
declare -A allowed=()
while IFS= read -r line; do
  line="${line%%#*}"
  read -r rule path _ <<<"$line" || true
  [ -n "${rule:-}" ] && [ -n "${path:-}" ] && allowed["$rule $path"]=unused
done <"$allow_file"

failures=0
report() { # rule path detail
  local key="$1 $2"
  if [ -n "${allowed[$key]+x}" ]; then
    allowed[$key]=used
  else
    echo "style: $1: $2: $3" >&2
    failures=$((failures + 1))
  fi
}

mapfile -t files < <(git ls-files '*.rs' | grep -v '^fuzz/')

for f in "${files[@]}"; do
  [ -f "$f" ] || continue
  lines=$(wc -l <"$f")
  case "$f" in
    */tests/* | tests/tests/* | */tests.rs) limit=1500 ;;
    *) limit=800 ;;
  esac
  if [ "$lines" -gt "$limit" ]; then
    report length "$f" "$lines lines (at most $limit; split it into a folder module)"
  fi
  case "$f" in
    */src/*)
      base=$(basename "$f")
      if [ "$base" != main.rs ] && [ "$base" != tests.rs ] && ! head -n1 "$f" | grep -q '^//!'; then
        report module-doc "$f" "no module doc (//!) on the first line"
      fi
      ;;
  esac
done

while IFS= read -r hit; do
  report super-glob "${hit%%:*}" "line ${hit#*:}: use super::* outside tests (import the names)"
done < <(awk '
  FNR == 1 { intest = 0 }
  /#\[cfg\(test\)\]/ { intest = 1 }
  /^[[:space:]]*use super::\*;/ {
    if (!intest && FILENAME !~ /(^|\/)tests\.rs$/ && FILENAME !~ /(^|\/)tests\//) print FILENAME ":" FNR
  }' "${files[@]}")

while IFS= read -r f; do
  report provider-in-edge "$f" "names a provider crate (only the factory list may)"
# A path into a crate (`switchyard_provider_x::`), not a metric named switchyard_provider_*.
done < <(git ls-files 'services/edge/src/*.rs' | xargs grep -lE 'switchyard_provider_[a-z_]+::' || true)

for key in "${!allowed[@]}"; do
  if [ "${allowed[$key]}" = unused ]; then
    echo "style: $allow_file: '$key' matches nothing any more; remove it" >&2
    failures=$((failures + 1))
  fi
done

if [ "$failures" -gt 0 ]; then
  echo "style: $failures finding(s); see CODE_STYLE.md" >&2
  exit 1
fi
echo "style: ok (${#files[@]} files)" >&2
