#!/usr/bin/env bash
# kcat (the Debian/Ubuntu package `kcat`, formerly kafkacat) is the third-party Kafka client the
# integration tests interoperate with: it produces malformed messages and records topics in the
# `-J` envelope that `headroom record`/`replay` share. Installs it with apt-get (as root, or
# through sudo); on other systems install kcat with the system's package manager.
set -euo pipefail
if command -v kcat >/dev/null 2>&1; then exit 0; fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "kcat is missing and apt-get is not available: install kcat with your package manager" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "kcat is missing: install it as root (apt-get install kcat)" >&2
    exit 1
  fi
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
# Try without refreshing the package lists first (fast when they are current).
if ! $SUDO apt-get install -y -q kcat >"$log" 2>&1; then
  if ! { $SUDO apt-get update -q && $SUDO apt-get install -y -q kcat; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "could not install kcat (apt-get install kcat)" >&2
    exit 1
  fi
fi
command -v kcat >/dev/null 2>&1 || { echo "kcat installed but not on PATH" >&2; exit 1; }
echo "installed $(kcat -V 2>&1 | head -n 1)" >&2
