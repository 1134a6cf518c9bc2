#!/usr/bin/env bash
# chromium (the Debian/Ubuntu package `chromium`) renders report.html headless in the browser test
# (tests/integration/test_report_browser.py): the page must load with no console error and every
# plot must decode. Installs it with apt-get (as root, or through sudo); on other systems install
# chromium with the system's package manager.
set -euo pipefail
have() { command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; }
if have; then exit 0; fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "chromium is missing and apt-get is not available: install chromium with your package" \
    "manager" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "chromium is missing: install it as root (apt-get install chromium)" >&2
    exit 1
  fi
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
# Try without refreshing the package lists first (fast when they are current).
if ! $SUDO apt-get install -y -q --no-install-recommends chromium >"$log" 2>&1; then
  if ! { $SUDO apt-get update -q &&
    $SUDO apt-get install -y -q --no-install-recommends chromium; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "could not install chromium (apt-get install chromium)" >&2
    exit 1
  fi
fi
have || { echo "chromium installed but not on PATH" >&2; exit 1; }
echo "installed $( (chromium --version || chromium-browser --version) 2>/dev/null | head -n 1)" >&2
