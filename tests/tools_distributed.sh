#!/usr/bin/env bash
# train_transformer --distributed under `mpirun -np 2`: the toy corpus learns all 8 pairs with rank 0
# alone printing; on a tiny corpus, --max-steps stops both ranks with one checkpoint, which resumes at
# world size 1 (--accumulate 2) and back at 2, and --no-overlap changes no bit of it; SIGUSR1 to mpirun
# (which forwards it) saves and stops every rank; an error on one rank ends the job with that rank
# named; a build without MPI refuses --distributed.
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
expect 0 "2 ranks learn it with bfloat16 gradients" '^8/8 correct$' \
  "${ranks2[@]}" "$tool" --distributed --threads 1 --grad-compression bf16

# A tiny parallel corpus of made-up words, 40 pairs: 3 epochs of 3 steps at this batch budget.
for i in $(seq 0 39); do
  echo "w$((i % 10)) v$((i * 7 % 10)) u$((i % 4))" >>"$work/train.src"
  echo "a$((i % 10)) b$((i * 7 % 10)) c$((i % 4))" >>"$work/train.tgt"
done
ckpt="$work/tiny.safetensors"
tiny=(--train-src "$work/train.src" --train-tgt "$work/train.tgt" --d-model 16 --heads 2 --layers 1 --d-ff 32
      --max-len 8 --subword none --min-freq 1 --max-tokens 64 --warmup 10 --epochs 3 --threads 1 --checkpoint "$ckpt")
expect 0 "--max-steps stops both ranks with one checkpoint" "stopped after --max-steps: checkpoint saved" \
  "${ranks2[@]}" "$tool" --distributed "${tiny[@]}" --max-steps 4
expect 0 "it resumes alone with --accumulate 2" "resuming from .* step 4" \
  "$tool" --accumulate 2 "${tiny[@]}" --max-steps 2 --resume
expect 0 "and again on 2 ranks, to the end" "resuming from .* step 6" \
  "${ranks2[@]}" "$tool" --distributed "${tiny[@]}" --resume

# Reduced after backward instead of while it runs, the same buckets sum to the same gradients.
for when in during after; do
  flags=(); [ "$when" = after ] && flags=(--no-overlap)
  expect 0 "2 ranks reducing $when backward" "stopped after --max-steps: checkpoint saved" \
    "${ranks2[@]}" "$tool" --distributed "${tiny[@]}" --max-steps 3 --checkpoint "$work/$when.safetensors" "${flags[@]}"
done
if cmp -s "$work/during.safetensors" "$work/after.safetensors"; then
  ok "--no-overlap writes the checkpoint overlapping writes"
else
  fail "--no-overlap changed the checkpoint"
fi

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
expect 2 "--grad-compression fp16 is bad usage" "--grad-compression must be none or bf16, not 'fp16'" \
  "$tool" --grad-compression fp16
exit $((failures > 0))
