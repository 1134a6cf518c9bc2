#!/usr/bin/env bash
# kcat (Debian package) is the third-party Kafka client the integration tests interoperate with.
set -euo pipefail
if command -v kcat >/dev/null 2>&1; then exit 0; fi
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y -q kcat >/dev/null 2>&1 || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q kcat >/dev/null; }
command -v kcat >/dev/null 2>&1 || { echo "could not install kcat (apt-get install kcat)" >&2; exit 1; }
