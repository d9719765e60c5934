#!/usr/bin/env bash
# The tools' command-line contract: --help exits 0, bad usage exits 2 with a message, and the demo
# really trains (its final accuracy line is checked, not just its exit status).
set -u
demo="$1"
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

output=$("$demo" --steps 300 --points 400 --seed 1 2>&1)
echo "$output" | tail -n 2
accuracy=$(echo "$output" | sed -n 's/.*training accuracy \([0-9.]*\)%.*/\1/p')
if [ -z "$accuracy" ] || ! awk -v a="$accuracy" 'BEGIN { exit !(a >= 95) }'; then
  echo "FAIL: demo accuracy '$accuracy' below 95%"; failures=$((failures + 1))
else
  passed=$((passed + 1))
fi
rm -f /tmp/mf_cli_out.$$
echo "$passed passed, $failures failed"
[ "$failures" -eq 0 ]
