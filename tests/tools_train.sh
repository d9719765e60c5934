#!/usr/bin/env bash
# train_transformer's command-line contract: the toy run learns all 8 pairs, a tiny real-corpus run
# writes a checkpoint and a chart and resumes from it, and bad input exits non-zero with a message
# that names the problem (never a crash). A subword checkpoint is translated by tools/translate in a
# process of its own, with no other file.
# Usage: tools_train.sh TRAIN_TRANSFORMER TRANSLATE
set -u
tool="$1"
translate="$2"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
passed=0
fail() { echo "FAIL: $1"; [ -f "$work/out" ] && cat "$work/out"; failures=$((failures + 1)); }
ok() { echo "ok: $1"; passed=$((passed + 1)); }
# expect STATUS DESCRIPTION PATTERN COMMAND...: exit status STATUS and PATTERN (grep -E) in the output.
expect() {
  local expected=$1 what=$2 pattern=$3; shift 3
  "$@" >"$work/out" 2>&1
  local status=$?
  if [ "$status" -ne "$expected" ]; then
    fail "$what: exit status $status, expected $expected"
  elif [ -n "$pattern" ] && ! grep -Eq -- "$pattern" "$work/out"; then
    fail "$what: output lacks /$pattern/"
  else
    ok "$what"
  fi
}

start=$(date +%s)
expect 0 "toy corpus: 8/8 correct" '^8/8 correct$' "$tool" --threads 2
echo "  (toy run took $(( $(date +%s) - start )) s)"
expect 0 "--help" 'usage: train_transformer' "$tool" --help
expect 2 "unknown flag" "unknown option '--no-such-flag'" "$tool" --no-such-flag
expect 2 "malformed number" "not a valid number" "$tool" --epochs two
expect 2 "unknown device" "--device: unknown device 'tpu'" "$tool" --device tpu
expect 2 "batch budget below --max-len" "below --max-len" "$tool" --max-tokens 8 --max-len 16
expect 2 "--train-src without --train-tgt" "go together" "$tool" --train-src x.de
expect 2 "unknown --precision" "--precision: expected fp32 or bf16, got 'fp16'" "$tool" --precision fp16

# Mixed precision: the toy run still learns every pair, its checkpoint keeps float32 weights (the
# safetensors header names F32), and they differ from the float32 run's (the products were rounded).
expect 0 "toy corpus under --precision bf16: 8/8 correct" '^8/8 correct$' \
  "$tool" --threads 2 --precision bf16 --checkpoint "$work/toy.bf16.safetensors"
"$tool" --threads 2 --checkpoint "$work/toy.fp32.safetensors" >"$work/out" 2>&1 || fail "toy run in fp32"
if grep -aq '"dtype":"BF16"' "$work/toy.bf16.safetensors" || ! grep -aq '"dtype":"F32"' "$work/toy.bf16.safetensors"; then
  fail "--precision bf16's checkpoint should hold float32 weights"
elif cmp -s "$work/toy.bf16.safetensors" "$work/toy.fp32.safetensors"; then
  fail "--precision bf16 trained the same bits as fp32: autocast changed nothing"
else
  ok "--precision bf16 keeps float32 weights in its checkpoint, trained apart from fp32's"
fi

# A tiny corpus: numbers spelled out in two "languages", with one empty and one overlong line.
words_a=(null eins zwei drei vier fuenf sechs sieben acht neun)
words_b=(zero one two three four five six seven eight nine)
for i in $(seq 0 39); do
  a=$((i % 10)); b=$(((i * 7) % 10))
  echo "${words_a[$a]} ${words_a[$b]} und ${words_a[$((9 - a))]}" >>"$work/train.src"
  echo "${words_b[$a]} ${words_b[$b]} and ${words_b[$((9 - a))]}" >>"$work/train.tgt"
done
echo "" >>"$work/train.src"; echo "" >>"$work/train.tgt"
echo "eins zwei drei vier fuenf sechs sieben acht neun eins zwei drei vier" >>"$work/train.src"
echo "one two three four five six seven eight nine one two three four" >>"$work/train.tgt"
head -n 8 "$work/train.src" >"$work/valid.src"; head -n 8 "$work/train.tgt" >"$work/valid.tgt"
tiny=(--train-src "$work/train.src" --train-tgt "$work/train.tgt" --valid-src "$work/valid.src"
      --valid-tgt "$work/valid.tgt" --d-model 16 --heads 2 --layers 1 --d-ff 32 --max-len 10 --subword none --min-freq 1
      --max-tokens 64 --warmup 10 --log-every 2 --threads 2 --checkpoint "$work/ckpt.safetensors")

expect 0 "tiny corpus, 1 epoch" 'epoch 1: train loss [0-9.]+, valid loss [0-9.]+, perplexity [0-9.]+, BLEU' \
  "$tool" "${tiny[@]}" --epochs 1
grep -q "1 pairs skipped for an empty line" "$work/out" && ok "empty line skipped and counted" || fail "empty line count"
grep -q "1 sources and 1 targets truncated to 9 tokens" "$work/out" && ok "overlong line truncated and counted" \
  || fail "truncation count"
[ -s "$work/ckpt.safetensors" ] && ok "checkpoint written" || fail "no checkpoint"
grep -q "<svg" "$work/ckpt.svg" 2>/dev/null && ok "SVG chart written" || fail "no SVG chart at $work/ckpt.svg"

# The models kept beside the checkpoint: the last epochs' and their average, validated with beam search;
# a model too slow to learn (--lr-factor 1e-6) never improves its BLEU, so --patience 1 stops after epoch 2.
mkdir -p "$work/kept"
kept=("${tiny[@]}" --checkpoint "$work/kept/run.safetensors")
expect 0 "--average-last 2 --valid-beam 2" \
  "averaged the last 2 epochs' models into '.*run.averaged.safetensors': BLEU [0-9.]+, chrF [0-9.]+" \
  "$tool" "${kept[@]}" --epochs 3 --average-last 2 --valid-beam 2
[ -s "$work/kept/run.epoch2.safetensors" ] && [ -s "$work/kept/run.epoch3.safetensors" ] &&
  [ ! -e "$work/kept/run.epoch1.safetensors" ] && ok "... the last 2 epochs' models kept, older ones removed" ||
  fail "epoch models: $(ls "$work/kept")"
expect 0 "--patience 1 stops when BLEU stops improving" "has not improved for 1 epochs \(--patience\): stopped early" \
  "$tool" "${kept[@]}" --checkpoint "$work/kept/slow.safetensors" --epochs 5 --patience 1 --lr-factor 1e-6
grep -q "^epoch 3:" "$work/out" && fail "... trained past epoch 2" || ok "... after epoch 2"
[ -s "$work/kept/slow.best.safetensors" ] && ok "... the best epoch's model kept" || fail "no best model"
expect 2 "--valid-beam 0" "--valid-beam must be at least 1" "$tool" --valid-beam 0

# Subwords: one SentencePiece model learned from both sides, stored in the checkpoint; a resume that
# would learn another (another size) is refused.
expect 0 "--subword unigram" "vocabulary subwords \\(SentencePiece, 300\\) shared by both sides" \
  "$tool" "${kept[@]}" --checkpoint "$work/kept/sub.safetensors" --epochs 1 --subword unigram --subword-size 300 \
  --max-len 24
# The checkpoint alone translates: cased, untokenized text, an empty line for an empty line, and no
# <unk> (byte fallback spells the unseen Cyrillic; decoding never picks <unk>).
printf 'eins zwei und acht\n\nЖук\n' >"$work/kept/sub.src"
if "$translate" --checkpoint "$work/kept/sub.safetensors" --input "$work/kept/sub.src" >"$work/kept/sub.out" 2>&1 &&
   [ "$(wc -l <"$work/kept/sub.out")" -eq 3 ] && [ -z "$(sed -n 2p "$work/kept/sub.out")" ] &&
   ! grep -qF -e '<unk>' -e '⁇' "$work/kept/sub.out"; then
  ok "the subword checkpoint translates in a fresh process: 3 lines, the empty one empty, no <unk>"
else
  fail "translating with the subword checkpoint: $(cat "$work/kept/sub.out")"
fi
expect 0 "--resume with subwords (the same model learned again)" "resuming from .*epoch 2, 0 batches done" \
  "$tool" "${kept[@]}" --checkpoint "$work/kept/sub.safetensors" --epochs 2 --subword unigram --subword-size 300 \
  --max-len 24 --resume
expect 1 "--resume with another --subword-size" "has src_vocab = 300, but the flags and data give 290" \
  "$tool" "${kept[@]}" --checkpoint "$work/kept/sub.safetensors" --epochs 3 --subword unigram --subword-size 290 \
  --max-len 24 --resume
# Subword sampling: each epoch trains on its own segmentations, drawn from --seed and the epoch, so a run
# stopped mid-epoch and resumed ends where an unbroken one does, bit for bit; it trains another model
# than the best segmentations do; a resume with another --subword-alpha is refused.
sampled=("${kept[@]}" --subword unigram --subword-size 300 --max-len 24 --average-last 0 --epochs 2)
expect 0 "--subword-alpha 0.2, stopped mid-run" "subword sampling: alpha 0.2, nbest -1" \
  "$tool" "${sampled[@]}" --subword-alpha 0.2 --max-steps 3 --checkpoint "$work/kept/spl_part.safetensors"
expect 0 "... resumed" "resuming from .*step 3" \
  "$tool" "${sampled[@]}" --subword-alpha 0.2 --checkpoint "$work/kept/spl_part.safetensors" --resume
"$tool" "${sampled[@]}" --subword-alpha 0.2 --checkpoint "$work/kept/spl_full.safetensors" >/dev/null 2>&1
"$tool" "${sampled[@]}" --checkpoint "$work/kept/spl_best.safetensors" >/dev/null 2>&1
cmp -s "$work/kept/spl_part.safetensors" "$work/kept/spl_full.safetensors" &&
  ok "... the resumed sampled run = the unbroken one, bit for bit" || fail "the resumed sampled run differs"
cmp -s "$work/kept/spl_full.safetensors" "$work/kept/spl_best.safetensors" &&
  fail "sampling trained the same model as the best segmentations" || ok "... and not the unsampled run's model"
expect 1 "--resume with another --subword-alpha" "trained with --subword-alpha 0.2, but this run has 0.5" \
  "$tool" "${sampled[@]}" --subword-alpha 0.5 --checkpoint "$work/kept/spl_part.safetensors" --epochs 3 --resume
expect 2 "--subword-alpha with words" "--subword-alpha samples subword segmentations: it needs --subword" \
  "$tool" --subword none --subword-alpha 0.1
expect 2 "--subword-alpha 1 with bpe" "below 1 for bpe" "$tool" --subword bpe --subword-alpha 1
expect 2 "--subword-nbest 1" "--subword-nbest must be -1 \(every segmentation\) or at least 2, not 1" \
  "$tool" --subword-nbest 1
expect 1 "subwords by default: 8,000 pieces are too many for 40 sentences" \
  "could not learn a 8000-piece unigram model: .*Please set it to a value <= [0-9]+" \
  "$tool" --train-src "$work/train.src" --train-tgt "$work/train.tgt" --epochs 1 --checkpoint "$work/kept/d.safetensors"
expect 2 "--subword wordpiece" "--subword must be unigram, bpe or none, not 'wordpiece'" "$tool" --subword wordpiece
expect 2 "--average-last without a checkpoint" "--average-last keeps models beside --checkpoint" \
  "$tool" --average-last 2

expect 0 "--resume to epoch 2" 'resuming from .*epoch 2, 0 batches done' "$tool" "${tiny[@]}" --epochs 2 --resume
grep -q "^epoch 2: train loss" "$work/out" && ok "resumed run trains epoch 2" || fail "no epoch 2 after resume"
expect 1 "--resume with another model" "d_model = 16, but the flags and data give 32" \
  "$tool" "${tiny[@]}" --d-model 32 --epochs 3 --resume
expect 1 "--resume with another schedule" "trained with --warmup 10" "$tool" "${tiny[@]}" --warmup 20 --epochs 3 --resume
expect 1 "--resume with other batches" "trained with --batch-pool 0" "$tool" "${tiny[@]}" --batch-pool 8 --epochs 3 \
  --resume
expect 1 "--resume with other data (vocabulary)" "other vocabularies" \
  "$tool" "${tiny[@]}" --train-src "$work/valid.src" --train-tgt "$work/valid.tgt" --epochs 3 --resume

# --max-steps stops mid-epoch with a checkpoint; resuming it ends exactly where an unbroken run does.
expect 0 "--max-steps 6 (mid-epoch 2)" "stopped after --max-steps" \
  "$tool" "${tiny[@]}" --epochs 3 --max-steps 6 --checkpoint "$work/part.safetensors"
expect 0 "--resume mid-epoch" "resuming from .*: epoch 2, [1-9][0-9]* batches done, step 6" \
  "$tool" "${tiny[@]}" --epochs 3 --checkpoint "$work/part.safetensors" --resume
"$tool" "${tiny[@]}" --epochs 3 --checkpoint "$work/full.safetensors" >/dev/null 2>&1
cmp -s "$work/part.safetensors" "$work/full.safetensors" && ok "resumed mid-epoch = unbroken run, bit for bit" \
  || fail "the mid-epoch resumed checkpoint differs from the unbroken run's"

# Ctrl-C: the current step finishes, the checkpoint is saved, exit 130; --resume then ends with a
# checkpoint byte-identical to an uninterrupted run's (same batches, same random stream, same curves).
long=("${tiny[@]}" --epochs 300 --log-every 1)
"$tool" "${long[@]}" --checkpoint "$work/int.safetensors" >"$work/out" 2>&1 &
pid=$!
for _ in $(seq 100); do sleep 0.05; grep -q "step" "$work/out" && break; done
kill -INT "$pid"; wait "$pid"; status=$?
if [ "$status" -eq 130 ] && grep -q "interrupted: checkpoint saved to '$work/int.safetensors'" "$work/out"; then
  ok "Ctrl-C saves and exits 130"
else
  fail "Ctrl-C: exit status $status"
fi
expect 0 "--resume after Ctrl-C" 'resuming from' "$tool" "${long[@]}" --checkpoint "$work/int.safetensors" --resume
grep "resuming from" "$work/out"
expect 0 "the same run without interruption" '^epoch 300:' "$tool" "${long[@]}" --checkpoint "$work/ref.safetensors"
cmp -s "$work/int.safetensors" "$work/ref.safetensors" && ok "interrupted + resumed = uninterrupted, bit for bit" \
  || fail "the resumed checkpoint differs from the uninterrupted run's"

# A diverging run stops at the first non-finite loss (exit 1) without saving over the last checkpoint.
# --lr-factor 1e30 makes the first Adam step move every weight by ~1e28, so the next forward
# overflows; with one batch per epoch (--max-tokens 500 holds all 41 pairs) epoch 1 ends, and saves,
# first. No validation set: its loss and BLEU would be computed from the diverged weights.
diverge=(--train-src "$work/train.src" --train-tgt "$work/train.tgt" --d-model 16 --heads 2 --layers 1 --d-ff 32
         --subword none --max-len 10 --min-freq 1 --max-tokens 500 --warmup 10 --lr-factor 1e30 --threads 2
         --checkpoint "$work/diverge.safetensors")
expect 0 "--lr-factor 1e30: epoch 1 (one step) is saved" 'epoch 1: train loss' "$tool" "${diverge[@]}" --epochs 1
cp "$work/diverge.safetensors" "$work/diverge.before"; cp "$work/diverge.svg" "$work/diverge.svg.before"
expect 1 "a non-finite loss stops the run" \
  "error: the training loss is (nan|inf) at step 2 \(epoch 2, batch 1/1\); stopped before updating the model, \
'.*diverge.safetensors' still holds step 1\. .*--detect-anomaly" "$tool" "${diverge[@]}" --epochs 3 --resume
cmp -s "$work/diverge.safetensors" "$work/diverge.before" && ok "the last checkpoint is left as it was" \
  || fail "the checkpoint changed after the non-finite loss"
cmp -s "$work/diverge.svg" "$work/diverge.svg.before" && ok "the chart is left as it was" \
  || fail "the chart was rewritten after the non-finite loss"
expect 1 "--detect-anomaly names the op and the line that first overflow" \
  "error: [a-z_]+: anomaly detected: output 0 \(\[[0-9, ]+\], float32\) has [0-9]+ (inf|NaN) values? \
.* at [a-z_]+\.cpp:[0-9]+$" "$tool" "${diverge[@]}" --epochs 3 --resume --detect-anomaly
grep -q "resuming from .*: epoch 2, 0 batches done, step 1" "$work/out" && ok "the kept checkpoint loads and resumes" \
  || fail "the kept checkpoint did not resume"
cmp -s "$work/diverge.safetensors" "$work/diverge.before" && ok "--detect-anomaly leaves the checkpoint as it was" \
  || fail "the checkpoint changed after --detect-anomaly stopped the run"

head -n 30 "$work/train.tgt" >"$work/short.tgt"
expect 1 "line counts differ" "has 42 lines but .* has 30; .* ends after line 30" "$tool" --train-src "$work/train.src" --train-tgt "$work/short.tgt"
expect 1 "missing file" "$work/missing.de" "$tool" --train-src "$work/missing.de" --train-tgt "$work/train.tgt"
# A checkpoint whose saved progress says batch -1 (edited by hand, or hostile) is refused, not indexed.
python3 - "$work/ckpt.safetensors" "$work/negative.safetensors" <<'PY'
import json, struct, sys
data = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
progress = json.loads(header["__metadata__"]["train_transformer.progress"])
progress["batch"] = -1
header["__metadata__"]["train_transformer.progress"] = json.dumps(progress)
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + data[8 + n:])
PY
expect 1 "a negative batch in the saved progress" "corrupt training progress: epoch [0-9]+ and batch -1 must not be negative" \
  "$tool" "${tiny[@]}" --checkpoint "$work/negative.safetensors" --resume
head -c 2000 "$work/ckpt.safetensors" >"$work/corrupt.safetensors"
expect 1 "corrupt checkpoint" "corrupt.safetensors" "$tool" "${tiny[@]}" --checkpoint "$work/corrupt.safetensors" --resume
# --device cuda trains on a GPU where there is one, and otherwise is refused (exit 1) saying why.
"$tool" "${tiny[@]}" --epochs 1 --device cuda --checkpoint "$work/cuda.safetensors" >"$work/out" 2>&1
status=$?
if [ "$status" -eq 0 ] && grep -Eq "on cuda:0" "$work/out" && grep -Eq '^epoch 1: train loss' "$work/out"; then
  ok "--device cuda trains on the GPU"
  expect 0 "--resume on cuda" "resuming from .*epoch 2, 0 batches done" \
    "$tool" "${tiny[@]}" --epochs 2 --device cuda --checkpoint "$work/cuda.safetensors" --resume
  expect 0 "a checkpoint written on cuda resumes on the CPU" "resuming from .*epoch 3, 0 batches done" \
    "$tool" "${tiny[@]}" --epochs 3 --checkpoint "$work/cuda.safetensors" --resume
elif [ "$status" -eq 1 ] && grep -Eq "^train_transformer: error: --device cuda: (this miniflow was built without CUDA|no CUDA \
device is available)" "$work/out"; then
  ok "--device cuda without a GPU: exit 1, saying why"
else
  fail "--device cuda: exit status $status"
fi
if [ "$status" -eq 1 ]; then
  expect 1 "--device cuda:1 without a GPU" "--device cuda:1: (this miniflow was built without CUDA|no CUDA device)" \
    "$tool" "${tiny[@]}" --device cuda:1
fi
expect 2 "--device cuda:x is bad usage" "--device: unknown device 'cuda:x' \(expected cpu, cuda or cuda:N\)" \
  "$tool" --device cuda:x

# Float32 training gives the same bits on the AVX-512 and AVX2 kernel paths (the three CPUs this
# project runs on): every reduction and GEMM sums each value in one order on both (ops/cpu/simd.h's
# kSumWidth, ops/cpu/sgemm_kernel.inc). The toy run covers embedding, attention, layer norm, dropout,
# label-smoothed cross-entropy, gradient clipping and Adam, on 2 threads.
if MINIFLOW_ISA=avx512 "$tool" --version 2>&1 | grep -q "kernels avx512"; then
  for isa in avx512 avx2; do
    MINIFLOW_ISA=$isa "$tool" --threads 2 --checkpoint "$work/toy.$isa.safetensors" >"$work/out" 2>&1 \
      || fail "toy run on the $isa path"
  done
  cmp -s "$work/toy.avx512.safetensors" "$work/toy.avx2.safetensors" \
    && ok "the toy run's checkpoint is bit for bit the same on the AVX2 path as on the AVX-512 path" \
    || fail "the toy run's checkpoint differs between the AVX2 and AVX-512 paths"
else
  echo "skipped: this CPU has no AVX-512, so only the AVX2 path runs here"
fi

echo "$passed passed, $failures failed"
[ "$failures" -eq 0 ]
