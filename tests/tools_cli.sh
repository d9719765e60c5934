#!/usr/bin/env bash
# The tools' command-line contract: --help exits 0, bad usage exits 2 with a message, and the demo
# really trains (its final accuracy line is checked, not just its exit status); bench_transformer
# runs with the fewest steps it accepts.
set -u
demo="$1"
bench="$2"
failures=0
passed=0
expect_status() {  # expected-status description command...
  local expected=$1 what=$2; shift 2
  "$@" >/tmp/mf_cli_out.$$ 2>&1
  local status=$?
  if [ "$status" -ne "$expected" ]; then
    echo "FAIL: $what: exit status $status, expected $expected"; cat /tmp/mf_cli_out.$$; failures=$((failures + 1))
  else
    echo "ok: $what"; passed=$((passed + 1))
  fi
}
expect_status 0 "--help" "$demo" --help
expect_status 2 "unknown flag" "$demo" --no-such-flag
expect_status 2 "malformed number" "$demo" --steps ten
expect_status 2 "missing value" "$demo" --steps
expect_status 2 "non-positive size" "$demo" --points 0
if grep -q "unknown option '--no-such-flag'" <("$demo" --no-such-flag 2>&1); then
  passed=$((passed + 1))
else
  echo "FAIL: unknown flag not named"; failures=$((failures + 1))
fi

# --version and --help name the kernel path; MINIFLOW_ISA narrows it, and a bad value is named on stderr
# (the run goes on at the CPU's own width).
expect_status 0 "--version" "$demo" --version
check_output() {  # description pattern command...
  local what=$1 pattern=$2; shift 2
  if "$@" 2>&1 | grep -qE "$pattern"; then
    passed=$((passed + 1))
  else
    echo "FAIL: $what: output lacks /$pattern/"; "$@" 2>&1 | tail -n 5; failures=$((failures + 1))
  fi
}
check_output "--version names miniflow's version and CUDA" '^demo_two_moons \(miniflow [0-9.]+\)$' "$demo" --version
check_output "--help names the kernel path" '^CPU .*: kernels (avx512|avx2|baseline) \(' "$demo" --help
check_output "MINIFLOW_ISA=baseline is honoured" 'kernels baseline \(MINIFLOW_ISA=baseline; this CPU runs' \
  env MINIFLOW_ISA=baseline "$demo" --version
check_output "a bad MINIFLOW_ISA is named" "^miniflow: warning: MINIFLOW_ISA='avx9000' is not one of avx512, avx2, baseline" \
  env MINIFLOW_ISA=avx9000 "$demo" --version

output=$("$demo" --steps 300 --points 400 --seed 1 2>&1)
echo "$output" | tail -n 2
accuracy=$(echo "$output" | sed -n 's/.*training accuracy \([0-9.]*\)%.*/\1/p')
if [ -z "$accuracy" ] || ! awk -v a="$accuracy" 'BEGIN { exit !(a >= 95) }'; then
  echo "FAIL: demo accuracy '$accuracy' below 95%"; failures=$((failures + 1))
else
  passed=$((passed + 1))
fi
# One timed step still gives every figure (the GEMM yardstick used to time only one of its two
# products then, and took the median of none).
expect_status 0 "bench_transformer --steps 1" "$bench" --config seed --steps 1 --threads 1
expect_status 2 "bench_transformer --steps 0" "$bench" --config seed --steps 0
rm -f /tmp/mf_cli_out.$$
echo "$passed passed, $failures failed"
[ "$failures" -eq 0 ]
