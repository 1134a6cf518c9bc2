#!/usr/bin/env bash
# Runs the whole test suite (arguments go to pytest). Unless KAFKA_BOOTSTRAP_SERVERS names a
# cluster, brings up the local test broker first — its own state directory, a free port — and
# always stops it afterwards, so no broker is left running whatever the outcome (a failure, a
# Ctrl-C, a kill of this script with SIGTERM).
#
# Expects `headroom` and `python` of the project's virtual environment on PATH (`make test`
# arranges that).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${KAFKA_BOOTSTRAP_SERVERS:-}" ]; then
  state_dir="$(mktemp -d "${TMPDIR:-/tmp}/headroom-test-kafka.XXXXXX")"
  cleanup() {
    status=$?
    headroom kafka stop --state-dir "$state_dir" >/dev/null 2>&1 || true
    if [ "$status" -ne 0 ] && [ -s "$state_dir/logs/server.log" ]; then
      echo "test broker log kept at $state_dir/logs/server.log" >&2
    else
      rm -rf "$state_dir"
    fi
    exit "$status"
  }
  trap cleanup EXIT
  # A signal ends the script (through the EXIT trap), it does not resume it.
  trap 'exit 130' INT
  trap 'exit 143' TERM
  port="$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  # `kafka start` prints the bootstrap address as its last stdout line; its log goes to stderr.
  address="$(headroom kafka start --port "$port" --state-dir "$state_dir")"
  KAFKA_BOOTSTRAP_SERVERS="$(printf '%s\n' "$address" | tail -n 1)"
  export KAFKA_BOOTSTRAP_SERVERS
fi
echo "tests use Kafka at $KAFKA_BOOTSTRAP_SERVERS" >&2
# pytest runs in the background so that a signal reaches this script at once (bash defers traps
# while a foreground child runs) and is passed on: the broker is stopped right away, not after
# the suite. (A background child of a script ignores SIGINT, hence SIGTERM for both.)
python -m pytest "$@" &
tests=$!
trap 'kill -TERM "$tests" 2>/dev/null; wait "$tests"; exit 130' INT
trap 'kill -TERM "$tests" 2>/dev/null; wait "$tests"; exit 143' TERM
wait "$tests"
