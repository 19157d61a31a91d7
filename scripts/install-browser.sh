#!/usr/bin/env bash
# Installs what the console's browser test (tests/tests/console_browser.rs) drives: Debian's
# headless Chromium and its chromedriver. Idempotent: does nothing when both are present.
# Exits non-zero when they cannot be installed (the test then skips with the reason).
set -euo pipefail

have() { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; }

if have; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "[install-browser] apt-get is not available; cannot install chromium" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "[install-browser] not root and no sudo; cannot install chromium" >&2
    exit 1
  fi
fi
echo "[install-browser] installing chromium and chromium-driver" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq || echo "[install-browser] apt-get update failed; trying the cached lists" >&2
$SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core >&2
have
