#!/usr/bin/env bash
# Runs the whole test suite. Unless KAFKA_BOOTSTRAP_SERVERS names a cluster, brings up the local
# test broker first (its own state directory, a free port) and always stops it afterwards, so no
# broker is left running whatever the outcome.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${KAFKA_BOOTSTRAP_SERVERS:-}" ]; then
  state_dir="$(mktemp -d "${TMPDIR:-/tmp}/headroom-test-kafka.XXXXXX")"
  cleanup() {
    headroom kafka stop --state-dir "$state_dir" >/dev/null 2>&1 || true
    rm -rf "$state_dir"
  }
  trap cleanup EXIT INT TERM
  port="$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  KAFKA_BOOTSTRAP_SERVERS="$(headroom kafka start --port "$port" --state-dir "$state_dir" | tail -n 1)"
  export KAFKA_BOOTSTRAP_SERVERS
fi
echo "tests use Kafka at $KAFKA_BOOTSTRAP_SERVERS"
python -m pytest "$@"
