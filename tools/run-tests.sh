#!/usr/bin/env bash
# Runs the whole test suite (arguments go to pytest). Unless KAFKA_BOOTSTRAP_SERVERS names a
# cluster, brings up the local test broker first — its own state directory, a free port — and
# always stops it afterwards, so no broker is left running whatever the outcome (a failure, a
# Ctrl-C, a kill of this script with SIGTERM).
#
# Expects `headroom` and `python` of the project's virtual environment on PATH (`make test`
# arranges that).
#
# `--whole-suite` (what `make test` passes when no PYTEST_ARGS are given) runs the suite in two
# pytest processes side by side: tests/integration, which mostly waits on real time, and
# tests/unit + tests/simulation, which mostly compute, under `nice` so that the real-time stacks
# of the integration tests come first on the CPU. Each measures branch coverage into its own data
# file; the two are combined and reported once, against the floor of pyproject.toml. The
# integration tests print as they run; the unit and simulation tests' output follows, then the
# integration summary again if they failed, the coverage and one line with the three verdicts.
set -euo pipefail
cd "$(dirname "$0")/.."

whole_suite=0
if [ "${1:-}" = "--whole-suite" ]; then
  whole_suite=1
  shift
fi

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
  # `kafka start` prints the bootstrap address as its last stdout line; its log goes to stderr.
  # A port free when picked can be taken by another socket before the broker binds it: such a
  # start ("Address already in use") is tried again on another port, three times in all.
  for attempt in 1 2 3; do
    port="$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    if address="$(headroom kafka start --port "$port" --state-dir "$state_dir" 2>"$state_dir.err")"; then
      cat "$state_dir.err" >&2
      rm -f "$state_dir.err"
      break
    fi
    cat "$state_dir.err" >&2
    if [ "$attempt" -eq 3 ] || ! grep -q "Address already in use" "$state_dir.err"; then
      rm -f "$state_dir.err"
      exit 1
    fi
    headroom kafka stop --state-dir "$state_dir" >/dev/null 2>&1 || true
    rm -rf "$state_dir" "$state_dir.err"
    mkdir -p "$state_dir"
  done
  KAFKA_BOOTSTRAP_SERVERS="$(printf '%s\n' "$address" | tail -n 1)"
  export KAFKA_BOOTSTRAP_SERVERS
fi
echo "tests use Kafka at $KAFKA_BOOTSTRAP_SERVERS" >&2
# pytest runs in the background so that a signal reaches this script at once (bash defers traps
# while a foreground child runs) and is passed on: the broker is stopped right away, not after
# the suite. (A background child of a script ignores SIGINT, hence SIGTERM for both.)
if [ "$whole_suite" -eq 0 ]; then
  python -m pytest "$@" &
  tests=$!
  trap 'kill -TERM "$tests" 2>/dev/null; wait "$tests"; exit 130' INT
  trap 'kill -TERM "$tests" 2>/dev/null; wait "$tests"; exit 143' TERM
  status=0
  wait "$tests" || status=$?
  exit "$status"
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/headroom-tests.XXXXXX")"
covered=(--cov --cov-report= --cov-fail-under=0)
COVERAGE_FILE="$work/coverage.compute" nice -n 19 python -m pytest tests/unit tests/simulation \
  "${covered[@]}" --basetemp "$work/compute" "$@" >"$work/compute.log" 2>&1 &
compute=$!
COVERAGE_FILE="$work/coverage.integration" python -m pytest tests/integration \
  "${covered[@]}" --basetemp "$work/integration" "$@" > >(tee "$work/integration.log") 2>&1 &
integration=$!
trap 'kill -TERM "$compute" "$integration" 2>/dev/null; wait; exit 130' INT
trap 'kill -TERM "$compute" "$integration" 2>/dev/null; wait; exit 143' TERM
integration_status=0
wait "$integration" || integration_status=$?
compute_status=0
wait "$compute" || compute_status=$?
echo
echo "=== tests/unit and tests/simulation (run beside the integration tests) ==="
cat "$work/compute.log"
echo
echo "=== branch coverage of the whole suite ==="
coverage_status=0
COVERAGE_FILE="$work/coverage" coverage combine --quiet \
  "$work/coverage.compute" "$work/coverage.integration" || coverage_status=$?
if [ "$coverage_status" -eq 0 ]; then
  COVERAGE_FILE="$work/coverage" coverage report --skip-covered || coverage_status=$?
fi
if [ "$integration_status" -ne 0 ]; then
  echo
  echo "=== tests/integration, again: its summary ==="
  sed -n '/short test summary info/,$p' "$work/integration.log"
fi
echo "integration tests: exit $integration_status; unit and simulation tests: exit" \
  "$compute_status; coverage floor: exit $coverage_status" >&2
if [ "$integration_status" -ne 0 ] || [ "$compute_status" -ne 0 ] || [ "$coverage_status" -ne 0 ]; then
  echo "test logs and temporary files kept in $work" >&2
  exit 1
fi
rm -rf "$work"
