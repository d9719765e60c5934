#!/usr/bin/env bash
# Failures end a job, never hang it: for each way rank 1 of a 2-rank job can fail (distributed_failures.cpp),
# mpirun must exit non-zero within a bound well under a hang, with the error naming the collective and
# the rank that did not arrive where miniflow is the one to see it, and no rank left running.
set -u
program=$(realpath "$1")
timeout_seconds=2
bound=20  # seconds: the timeout, the grace to ask the other ranks, MPI's start and teardown
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0
# The ranks' command lines (not this script's), by this build's path: other checkouts' suites may be running.
ranks="$(printf '%s' "$program" | sed 's/[][\\.*^$+?(){}|]/\\&/g') (stall|kill|error) "

# run SCENARIO PATTERN: the job must end non-zero within the bound, its stderr matching PATTERN.
run() {
  local scenario=$1 pattern=$2 start status elapsed
  start=$(date +%s%N)
  timeout -k 5 120 mpirun -np 2 --oversubscribe "$program" "$scenario" "$timeout_seconds" \
    >"$dir/out" 2>"$dir/err"
  status=$?
  elapsed=$((($(date +%s%N) - start) / 1000000))  # milliseconds
  if [ "$status" -eq 0 ] || [ "$status" -eq 124 ]; then
    echo "FAIL: $scenario: exit status $status (0: the failure went unnoticed; 124: the job hung)"
    failures=$((failures + 1))
  elif ((elapsed > bound * 1000)); then
    echo "FAIL: $scenario: the job took ${elapsed} ms to end (bound ${bound} s)"; failures=$((failures + 1))
  elif ! grep -Eq "$pattern" "$dir/err"; then
    echo "FAIL: $scenario: stderr does not match '$pattern':"; cat "$dir/err"; failures=$((failures + 1))
  else
    echo "ok: $scenario ended with status $status in ${elapsed} ms"
  fi
  sleep 0.5
  if pgrep -f "$ranks" >/dev/null; then
    echo "FAIL: $scenario: ranks left running:"; pgrep -af "$ranks"; failures=$((failures + 1))
    pkill -KILL -f "$ranks"
  fi
}

run stall "\[rank 0\] miniflow: all_reduce #2 \(sum, float32, 4 elements\) did not complete within 2 s: rank 1 has not reached it \(the last collective it finished is #1\)"
run kill "."  # mpirun sees the death first and ends the job; its own message names the process
run error "\[rank 1\] distributed_failures: a made-up error"
exit $((failures > 0))
