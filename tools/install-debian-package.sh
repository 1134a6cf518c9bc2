#!/usr/bin/env bash
# Installs a Debian/Ubuntu package that `make test` needs, unless one of its commands is already on
# PATH: `install-debian-package.sh PACKAGE COMMAND [COMMAND...]`. With apt-get, as root or through
# sudo; without apt-get it says to install the package with the system's package manager.
# Used for kcat (the third-party Kafka client the integration tests interoperate with) and
# chromium (which renders report.html in the browser test).
set -euo pipefail
if [ "$#" -lt 2 ]; then
  echo "usage: $0 PACKAGE COMMAND [COMMAND...]" >&2
  exit 2
fi
package="$1"
shift
have() {
  local c
  for c in "$@"; do
    if command -v "$c" >/dev/null 2>&1; then return 0; fi
  done
  return 1
}
if have "$@"; then exit 0; fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "$package is missing and apt-get is not available: install $package with your package" \
    "manager" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "$package is missing: install it as root (apt-get install $package)" >&2
    exit 1
  fi
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
# Try without refreshing the package lists first (fast when they are current).
if ! $SUDO apt-get install -y -q --no-install-recommends "$package" >"$log" 2>&1; then
  if ! { $SUDO apt-get update -q &&
    $SUDO apt-get install -y -q --no-install-recommends "$package"; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "could not install $package (apt-get install $package)" >&2
    exit 1
  fi
fi
have "$@" || { echo "$package installed but none of $* is on PATH" >&2; exit 1; }
echo "installed $package" >&2
