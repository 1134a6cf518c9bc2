#!/usr/bin/env bash
# Runs the whole test suite (arguments go to pytest). Unless KAFKA_BOOTSTRAP_SERVERS names a
# cluster, brings up the local test broker first — its own state directory, a free port — and
# always stops it afterwards, so no broker is left running whatever the outcome (a failure, a
# Ctrl-C, a kill of this script with SIGTERM).
#
# Expects `headroom` and `python` of the project's virtual environment on PATH (`make test`
# arranges that).
#
# `--whole-suite` (what `make test` passes when no PYTEST_ARGS are given) runs the suite in the
# lanes of tests/conftest.py (`pytest --lane`), each a pytest process: `compute` (tests/unit,
# tests/simulation and the integration modules that only compute) under `nice`, so that the
# real-time stacks of the integration tests come first on the CPU; beside it `stacks` and `kafka`,
# the integration tests that mostly wait on real time, in two processes; then, once those two have
# ended, `last` (the engines' comparison); once that has ended too, `compute` goes on at nice 0
# (when the user may lower a nice value). Each measures branch
# coverage into its own data file; they are combined and reported once, against the floor of
# pyproject.toml. Each lane's output is printed when it ends (`last` as it runs), then the
# summaries of the lanes that failed again, the coverage and one line with the verdicts.
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
# lane NAME PATH [PYTEST_ARGS…]: one lane in the background (its output in $work/NAME.log), its
# pid in $lane_pid; `$niceness` is the lane's nice value.
lane() {
  local name=$1 path=$2
  shift 2
  COVERAGE_FILE="$work/coverage.$name" nice -n "$niceness" python -m pytest "$path" \
    --lane "$name" "${covered[@]}" --basetemp "$work/$name" "$@" >"$work/$name.log" 2>&1 &
  lane_pid=$!
}
pids=()
trap 'kill -TERM "${pids[@]}" 2>/dev/null; wait; exit 130' INT
trap 'kill -TERM "${pids[@]}" 2>/dev/null; wait; exit 143' TERM
declare -A status
started=$SECONDS
niceness=19 lane compute tests "$@"
compute=$lane_pid
pids+=("$compute")
integration_lanes=(stacks kafka)
declare -A lane_pids
for name in "${integration_lanes[@]}"; do
  niceness=0 lane "$name" tests/integration "$@"
  lane_pids[$name]=$lane_pid
  pids+=("$lane_pid")
done
echo "lanes compute, ${integration_lanes[*]} started; their output follows as each ends" >&2
for name in "${integration_lanes[@]}"; do
  status[$name]=0
  wait "${lane_pids[$name]}" || status[$name]=$?
  echo
  echo "=== lane $name: tests/integration (exit ${status[$name]}, $((SECONDS - started)) s in) ==="
  cat "$work/$name.log"
done
echo
echo "=== lane last: tests/integration, once the other integration lanes have ended ==="
COVERAGE_FILE="$work/coverage.last" python -m pytest tests/integration --lane last \
  "${covered[@]}" --basetemp "$work/last" "$@" > >(tee "$work/last.log") 2>&1 &
last=$!
pids+=("$last")
status[last]=0
wait "$last" || status[last]=$?
# nothing real-time is left: the compute lane need no longer yield the CPU (on a host loaded by
# other work, niced it ran for twice as long as the integration lanes). Lowering a nice value
# needs the privilege to do so; without it the lane stays niced.
if kill -0 "$compute" 2>/dev/null && renice -n 0 -p "$compute" >/dev/null 2>&1; then
  echo "lane compute: nice 0 from here on ($((SECONDS - started)) s in)" >&2
fi
status[compute]=0
wait "$compute" || status[compute]=$?
echo
echo "=== lane compute: tests/unit, tests/simulation and the offline integration modules" \
  "(exit ${status[compute]}, $((SECONDS - started)) s in) ==="
cat "$work/compute.log"
echo
echo "=== branch coverage of the whole suite ==="
coverage_status=0
COVERAGE_FILE="$work/coverage" coverage combine --quiet "$work/coverage.compute" \
  "${integration_lanes[@]/#/$work/coverage.}" "$work/coverage.last" || coverage_status=$?
if [ "$coverage_status" -eq 0 ]; then
  COVERAGE_FILE="$work/coverage" coverage report --skip-covered || coverage_status=$?
fi
failed=0
for name in "${integration_lanes[@]}" last compute; do
  if [ "${status[$name]}" -ne 0 ]; then
    failed=1
    echo
    echo "=== lane $name, again: its summary ==="
    sed -n '/short test summary info/,$p' "$work/$name.log"
  fi
done
verdicts=""
for name in "${integration_lanes[@]}" last compute; do
  verdicts+="$name ${status[$name]}, "
done
echo "lanes (exit statuses): ${verdicts}coverage floor $coverage_status;" \
  "$((SECONDS - started)) s" >&2
if [ "$failed" -ne 0 ] || [ "$coverage_status" -ne 0 ]; then
  echo "test logs and temporary files kept in $work" >&2
  exit 1
fi
rm -rf "$work"
