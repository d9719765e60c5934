#!/usr/bin/env bash
# train_transformer --distributed under `mpirun -np 2`: the toy corpus learns all 8 pairs with rank 0
# alone printing; --max-steps stops both ranks with one checkpoint, which resumes at world size 1
# (--accumulate 2) and back at 2; SIGUSR1 to mpirun (which forwards it) saves and stops every rank; an
# error on one rank ends the job with that rank named; a build without MPI refuses --distributed.
set -u
tool="$1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
failures=0
fail() { echo "FAIL: $1"; cat "$work/out"; failures=$((failures + 1)); }
ok() { echo "ok: $1"; }
# expect STATUS DESCRIPTION PATTERN COMMAND...: exit status STATUS and PATTERN (grep -E) in the output.
expect() {
  local expected=$1 what=$2 pattern=$3; shift 3
  timeout -k 5 120 "$@" >"$work/out" 2>&1
  local status=$?
  if [ "$status" -ne "$expected" ]; then
    fail "$what: exit status $status, expected $expected"
  elif ! grep -Eq -- "$pattern" "$work/out"; then
    fail "$what: output lacks /$pattern/"
  else
    ok "$what"
  fi
}
ranks2=(mpirun -np 2 --oversubscribe)

expect 0 "2 ranks learn the toy corpus" '^8/8 correct$' "${ranks2[@]}" "$tool" --distributed --threads 1
if [ "$(grep -c '^8/8 correct$' "$work/out")" -ne 1 ] || [ "$(grep -c '^model:' "$work/out")" -ne 1 ]; then
  fail "rank 1 printed too: each line should appear once"
else
  ok "only rank 0 prints"
fi

ckpt="$work/toy.safetensors"
expect 0 "--max-steps stops both ranks with one checkpoint" "stopped after --max-steps: checkpoint saved" \
  "${ranks2[@]}" "$tool" --distributed --threads 1 --dropout 0.1 --max-steps 30 --checkpoint "$ckpt"
expect 0 "it resumes alone with --accumulate 2" "resuming from .* step 30" \
  "$tool" --accumulate 2 --threads 1 --dropout 0.1 --max-steps 30 --checkpoint "$ckpt" --resume
expect 0 "and again on 2 ranks, to the end" "resuming from .* step 60" \
  "${ranks2[@]}" "$tool" --distributed --threads 1 --dropout 0.1 --checkpoint "$ckpt" --resume

# SIGUSR1 to mpirun, once both ranks train: every rank stops after the same step, rank 0 saves.
"${ranks2[@]}" "$tool" --distributed --threads 1 --epochs 200 --checkpoint "$work/signal.safetensors" \
  >"$work/out" 2>&1 &
job=$!
for _ in $(seq 1 200); do grep -q "step" "$work/out" && break; sleep 0.1; done
kill -USR1 "$job"
wait "$job"
status=$?
if [ "$status" -eq 0 ] || ! grep -q "interrupted: checkpoint saved" "$work/out" || [ ! -f "$work/signal.safetensors" ]; then
  fail "SIGUSR1: exit status $status, a saved checkpoint expected"
else
  ok "SIGUSR1 saves one checkpoint and stops every rank"
fi

expect 1 "an error on every rank ends the job, naming the rank" '\[rank [01]\] train_transformer: error: .*no-such' \
  "${ranks2[@]}" "$tool" --distributed --threads 1 --train-src "$work/no-such.de" --train-tgt "$work/no-such.en"
expect 2 "--accumulate 0 is bad usage" "--accumulate must be positive" "$tool" --accumulate 0
exit $((failures > 0))
