#!/usr/bin/env bash
# tools/translate end to end: a toy model memorises eight pairs (tests/make_toy_checkpoint.cpp), then
# its translations (greedy, beam, n-best), BLEU and chrF, the attention heatmap, stdin/--input/--output and
# every bad-input case are checked against the documented output and exit statuses.
# tools/average_checkpoints, tools/quantize_checkpoint and tools/build_lexicon are checked here too, on the
# same toy checkpoint.
# Usage: tools_translate.sh TRANSLATE MAKE_TOY_CHECKPOINT AVERAGE_CHECKPOINTS QUANTIZE_CHECKPOINT BUILD_LEXICON
set -u
translate="$1"
maker="$2"
average="$3"
quantize="$4"
build_lexicon="$5"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
passed=0
failures=0
pass() { echo "ok: $1"; passed=$((passed + 1)); }
fail() { echo "FAIL: $1"; failures=$((failures + 1)); }

# expect WHAT STATUS PATTERN command...: the command exits with STATUS and, when PATTERN is not empty,
# its stderr contains PATTERN (a fixed string). Leaves stdout in $dir/stdout and stderr in $dir/stderr.
expect() {
  local what=$1 expected=$2 pattern=$3; shift 3
  "$@" >"$dir/stdout" 2>"$dir/stderr" </dev/null
  local status=$?
  if [ "$status" -ne "$expected" ]; then
    fail "$what: exit status $status, expected $expected"; cat "$dir/stderr"
  elif [ -n "$pattern" ] && ! grep -qF -- "$pattern" "$dir/stderr"; then
    fail "$what: stderr does not mention '$pattern'"; cat "$dir/stderr"
  else
    pass "$what"
  fi
}
# same_file WHAT EXPECTED ACTUAL
same_file() {
  if cmp -s "$2" "$3"; then pass "$1"; else fail "$1"; diff "$2" "$3"; fi
}

# same_scored_lines WHAT LINES EXPECTED ACTUAL: both files hold LINES lines "score<TAB>text", the same
# texts and scores within one unit of the 4th decimal (float32 rounding moves the last printed digit).
same_scored_lines() {
  if paste "$3" "$4" | awk -F'\t' -v lines="$2" '$2 != $4 || ($1 - $3) ^ 2 > 1.5e-4 ^ 2 { bad = 1 }
      END { exit bad || NR != lines }'; then
    pass "$1"
  else
    fail "$1"; paste "$3" "$4"
  fi
}

ckpt="$dir/toy.safetensors"
if ! "$maker" "$ckpt"; then
  fail "the toy model did not train"
  echo "$passed passed, $failures failed"
  exit 1
fi
"$maker" --plain "$dir/plain.safetensors"
"$maker" --other-config "$dir/other_config.safetensors"
"$maker" --other-vocab "$dir/other_vocab.safetensors"

printf '%s\n' "ich mochte ein bier" "ich mochte ein cola" "hello world" "i love you" "the cat is black" \
  "good morning" "this is a book" "what is your name" >"$dir/src.txt"
printf '%s\n' "i want a beer" "i want a coke" "hola mundo" "te amo" "el gato es negro" "buenos dias" \
  "este es un libro" "como te llamas" >"$dir/ref.txt"

# ---- translations ------------------------------------------------------------------------------
"$translate" --checkpoint "$ckpt" --input "$dir/src.txt" >"$dir/greedy.txt"
same_file "greedy translations of the training sources" "$dir/ref.txt" "$dir/greedy.txt"
"$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --beam 4 --batch-tokens 48 >"$dir/beam.txt"
same_file "beam 4 translations (length-sorted batches of at most 12 source tokens: 48 over 4 beams)" "$dir/ref.txt" "$dir/beam.txt"
# --timing counts the sentences with tokens and the tokens generated for them, <eos> left out: the
# 8 references hold 4 + 4 + 2 + 2 + 4 + 2 + 4 + 3 = 25 words, and a blank line is not a sentence.
printf '\n' | cat "$dir/src.txt" - >"$dir/src_blank.txt"
expect "--timing reports sentences and tokens" 0 "translate: 8 sentences, 25 tokens in " \
  "$translate" --checkpoint "$ckpt" --input "$dir/src_blank.txt" --timing
if grep -qE "^translate: CPU tensors peaked at [0-9.]+ MB, [0-9.]+ MB held by the allocator; [0-9]+ of [1-9][0-9]* blocks" \
  "$dir/stderr"; then pass "--timing reports the allocator's memory"; else fail "--timing: no memory line"; cat "$dir/stderr"; fi
"$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --beam 4 --precision bf16 >"$dir/bf16.txt"
same_file "--precision bf16 (autocast) translates the memorised pairs alike" "$dir/ref.txt" "$dir/bf16.txt"
# int8: weights quantized per output channel as the model loads, or once by quantize_checkpoint into
# a file of int8 values ("I8" in its header) about a quarter the size, which translates the same.
"$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --precision int8 >"$dir/int8.txt"
same_file "--precision int8 translates the memorised pairs alike" "$dir/ref.txt" "$dir/int8.txt"
"$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --beam 4 --precision int8 >"$dir/int8_beam.txt"
same_file "--precision int8 with beam 4 too" "$dir/ref.txt" "$dir/int8_beam.txt"
expect "quantize_checkpoint writes an int8 checkpoint" 0 "" \
  "$quantize" --checkpoint "$ckpt" --output "$dir/toy.int8.safetensors"
if grep -aq '"dtype":"I8"' "$dir/toy.int8.safetensors" &&
   [ "$(stat -c %s "$dir/toy.int8.safetensors")" -lt "$(( $(stat -c %s "$ckpt") / 2 ))" ]; then
  pass "... holding I8 tensors, under half the float32 file's size"
else
  fail "the int8 checkpoint holds no I8 tensors or is not smaller"
fi
"$translate" --checkpoint "$dir/toy.int8.safetensors" --input "$dir/src.txt" >"$dir/int8_file.txt"
same_file "the int8 checkpoint translates as --precision int8 does" "$dir/int8.txt" "$dir/int8_file.txt"
expect "--precision int8 on a GPU is refused" 2 "--precision int8 runs on the CPU only" \
  "$translate" --checkpoint "$ckpt" --precision int8 --device cuda
expect "averaging an int8 checkpoint is refused" 1 "holds int8 weights" \
  "$average" --output "$dir/avg_int8.safetensors" "$dir/toy.int8.safetensors" "$ckpt"
"$quantize" --checkpoint "$dir/toy.int8.safetensors" --output "$dir/toy.int8.again.safetensors" >"$dir/again.txt"
if grep -qF "holds int8 weights already" "$dir/again.txt"; then
  same_file "quantizing an int8 checkpoint says so and copies it" "$dir/toy.int8.safetensors" \
    "$dir/toy.int8.again.safetensors"
else
  fail "quantizing an int8 checkpoint does not say it was int8 already"; cat "$dir/again.txt"
fi
expect "quantize_checkpoint without --output" 2 "--output is required" "$quantize" --checkpoint "$ckpt"
expect "quantize_checkpoint of a missing file" 1 "no_such.safetensors" \
  "$quantize" --checkpoint "$dir/no_such.safetensors" --output "$dir/never.safetensors"
"$translate" --checkpoint "$ckpt" <"$dir/src.txt" >"$dir/stdin.txt"
same_file "stdin gives what --input gives" "$dir/greedy.txt" "$dir/stdin.txt"
"$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --beam 4 --output "$dir/out.txt" >"$dir/stdout.txt"
same_file "--output writes what stdout shows" "$dir/beam.txt" "$dir/out.txt"
if [ -s "$dir/stdout.txt" ]; then fail "--output still printed to stdout"; else pass "--output leaves stdout empty"; fi

# Empty and whitespace-only lines give empty output lines, in place.
printf 'hello world\n\nI love you\n   \r\n' | "$translate" --checkpoint "$ckpt" >"$dir/empty.txt"
printf 'hola mundo\n\nte amo\n\n' >"$dir/empty_expected.txt"
same_file "empty lines stay empty and in place (input lowercased by the model's tokenizer)" \
  "$dir/empty_expected.txt" "$dir/empty.txt"
# Invalid UTF-8 becomes U+FFFD inside its word (an unknown word), never an error.
printf 'hello \xff\xfe world\n' >"$dir/invalid_utf8.txt"
expect "invalid UTF-8 in the input is translated, not refused" 0 "" \
  "$translate" --checkpoint "$ckpt" --input "$dir/invalid_utf8.txt"
"$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --threads 1 >"$dir/one_thread.txt"
same_file "--threads 1 translates the same" "$dir/greedy.txt" "$dir/one_thread.txt"
"$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --beam 4 --threads 2 --batch-sentences 1 \
  --batch-workers 2 >"$dir/two_workers.txt"
same_file "two batches side by side (--batch-workers 2) translate the same" "$dir/beam.txt" "$dir/two_workers.txt"
expect "more --batch-workers than --threads is refused" 2 "--batch-workers must be between 0 and --threads (2), not 3" \
  "$translate" --checkpoint "$ckpt" --threads 2 --batch-workers 3

# The toy model's max_len is 16: sources keep 15 tokens (+ <eos>); a 20-word line is cut and counted.
echo "hello world hello world hello world hello world hello world hello world hello world hello world \
hello world hello world" >"$dir/long.txt"
expect "an overlong sentence is truncated and counted" 0 "1 sentence(s) longer than the model's 15 tokens were truncated" \
  "$translate" --checkpoint "$ckpt" --input "$dir/long.txt"
if [ "$(wc -l <"$dir/stdout")" -eq 1 ]; then pass "the overlong sentence still gets its line"; else
  fail "the overlong sentence's output"; fi

# ---- n-best ------------------------------------------------------------------------------------
"$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --beam 4 --nbest 3 >"$dir/nbest.txt"
if awk -F'\t' -v sentences=8 -v k=3 '
    NF != 2 || $1 !~ /^-?[0-9]+\.[0-9]+$/ { print "malformed line " NR ": " $0; bad = 1 }
    (NR - 1) % k != 0 && $1 + 0 > previous + 0 { print "line " NR " scores above the line before it"; bad = 1 }
    { previous = $1 }
    END { if (NR != sentences * k) { print NR " lines, expected " sentences * k; bad = 1 }; exit bad }' "$dir/nbest.txt"
then
  pass "--nbest 3 prints 3 'score<TAB>translation' lines per sentence, best first"
else
  fail "--nbest 3 output"; cat "$dir/nbest.txt"
fi
awk -F'\t' 'NR % 3 == 1 { print $2 }' "$dir/nbest.txt" >"$dir/nbest_best.txt"
same_file "the first of the n-best is the beam translation" "$dir/beam.txt" "$dir/nbest_best.txt"
if [ "$(awk -F'\t' '{ print int((NR - 1) / 3) "\t" $2 }' "$dir/nbest.txt" | sort | uniq -d | wc -l)" -eq 0 ]; then
  pass "n-best hypotheses of a sentence differ"
else
  fail "a sentence's n-best list repeats a hypothesis"
fi

# ---- --min-len and --no-repeat-ngram-size ---------------------------------------------------------
# The toy model's tokens are words. Every memorised translation is 2-4 words: with --min-len 6 each line
# must hold at least 6, and with --no-repeat-ngram-size 1 as well no word twice (the toy vocabulary
# holds more than 6 words, so a line always has one left).
for search in "--beam 1" "--beam 4"; do
  # shellcheck disable=SC2086  # $search is two words on purpose
  "$translate" --checkpoint "$ckpt" --input "$dir/src.txt" $search --min-len 6 >"$dir/min_len.txt"
  if awk 'NF < 6 { bad = 1 } END { exit bad || NR != 8 }' "$dir/min_len.txt"; then
    pass "--min-len 6 ($search): every translation holds at least 6 words"
  else
    fail "--min-len 6 ($search)"; cat "$dir/min_len.txt"
  fi
  # shellcheck disable=SC2086
  "$translate" --checkpoint "$ckpt" --input "$dir/src.txt" $search --min-len 6 --no-repeat-ngram-size 1 \
    >"$dir/no_repeat.txt"
  if awk '{ delete seen; for (i = 1; i <= NF; ++i) if (seen[$i]++) bad = 1 } NF < 6 { bad = 1 }
      END { exit bad || NR != 8 }' "$dir/no_repeat.txt"; then
    pass "--no-repeat-ngram-size 1 ($search): no word twice in a line, still at least 6"
  else
    fail "--no-repeat-ngram-size 1 ($search)"; cat "$dir/no_repeat.txt"
  fi
done
"$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --beam 4 --no-repeat-ngram-size 3 >"$dir/no_repeat3.txt"
same_file "--no-repeat-ngram-size 3 leaves the memorised translations (no 3 words twice in them) alone" \
  "$dir/ref.txt" "$dir/no_repeat3.txt"

# ---- sampling ----------------------------------------------------------------------------------
"$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --sampling --sampling-topk 1 >"$dir/top1.txt"
same_file "--sampling --sampling-topk 1 draws the greedy translations" "$dir/greedy.txt" "$dir/top1.txt"
"$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --sampling --temperature 3 --seed 7 >"$dir/sample_a.txt"
if [ "$(wc -l <"$dir/sample_a.txt")" -eq 8 ]; then pass "--sampling gives a line per input line"; else
  fail "--sampling's output lines"; fi
"$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --sampling --temperature 3 --seed 7 >"$dir/sample_c.txt"
same_file "--sampling with one --seed twice draws the same translations" "$dir/sample_a.txt" "$dir/sample_c.txt"
expect "--temperature without --sampling" 2 "--temperature, --sampling-topk and --sampling-topp need --sampling" \
  "$translate" --checkpoint "$ckpt" --temperature 0.5
expect "--sampling with --beam" 2 "--sampling draws one translation per line: --beam does not apply" \
  "$translate" --checkpoint "$ckpt" --sampling --beam 4
expect "--sampling-topp 0" 2 "--sampling-topp must be in (0, 1], not 0" \
  "$translate" --checkpoint "$ckpt" --sampling --sampling-topp 0

# ---- scoring given translations ------------------------------------------------------------------
# Each n-best hypothesis, scored as the translation of its source, must give back the log-probability
# the search found for it: its n-best score times the length penalty ((5 + words + <eos>) / 6)^0.6.
awk '{ for (k = 0; k < 3; ++k) print }' "$dir/src.txt" >"$dir/score_src.txt"
cut -f2 "$dir/nbest.txt" >"$dir/score_tgt.txt"
"$translate" --checkpoint "$ckpt" --input "$dir/score_src.txt" --score "$dir/score_tgt.txt" >"$dir/scores.txt"
if paste "$dir/nbest.txt" "$dir/scores.txt" | awk -F'\t' '
    { words = split($2, w, " "); penalty = ((5 + words + 1) / 6) ^ 0.6
      if (NF != 4 || $4 != words + 1) { print "line " NR ": expected " words + 1 " tokens: " $0; bad = 1 }
      if (($3 / penalty - $1) ^ 2 > 2e-4 ^ 2) { print "line " NR ": " $3 " / " penalty " is not " $1; bad = 1 } }
    END { if (NR != 24) { print NR " lines"; bad = 1 }; exit bad }'
then
  pass "--score gives each n-best hypothesis the log-probability its search found, and its tokens"
else
  fail "--score against the n-best scores"; paste "$dir/nbest.txt" "$dir/scores.txt"
fi
printf '%s\n' "i want a beer" "" >"$dir/score_two.txt"
printf '%s\n' "ich mochte ein bier" "" | "$translate" --checkpoint "$ckpt" --score "$dir/score_two.txt" >"$dir/scores.txt"
if awk -F'\t' 'NR == 1 && $2 == 5 && $1 <= 0 { ok++ } NR == 2 && $2 == 1 && $1 < 0 { ok++ } END { exit !(NR == 2 && ok == 2) }' \
    "$dir/scores.txt"; then
  pass "--score reads stdin, and scores an empty target as <eos> alone"
else
  fail "--score on stdin with an empty line"; cat "$dir/scores.txt"
fi
expect "--score with --beam" 2 "--score scores given translations: --beam does not apply" \
  "$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --score "$dir/ref.txt" --beam 4
expect "--score with --no-repeat-ngram-size" 2 \
  "--score scores given translations: --no-repeat-ngram-size does not apply" \
  "$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --score "$dir/ref.txt" --no-repeat-ngram-size 2
expect "--score with a file of another length" 1 "file to score '$dir/score_two.txt' has 2 lines but the input" \
  "$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --score "$dir/score_two.txt"
expect "--score with a missing file" 1 "cannot open file to score '$dir/none.txt'" \
  "$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --score "$dir/none.txt"

# ---- input read a group of lines at a time (--buffer-lines) ---------------------------------------
for lines in 1 3 0; do
  "$translate" --checkpoint "$ckpt" --input "$dir/src_blank.txt" --beam 2 --nbest 2 --buffer-lines $lines \
    >"$dir/group_$lines.txt"
done
"$translate" --checkpoint "$ckpt" --input "$dir/src_blank.txt" --beam 2 --nbest 2 >"$dir/group_default.txt"
same_file "--buffer-lines 1 gives the n-best lines of the whole input at once" "$dir/group_0.txt" "$dir/group_1.txt"
same_file "--buffer-lines 3 gives the n-best lines of the whole input at once" "$dir/group_0.txt" "$dir/group_3.txt"
same_file "the default buffer gives the n-best lines of the whole input at once" "$dir/group_0.txt" \
  "$dir/group_default.txt"
"$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --score "$dir/ref.txt" >"$dir/scores_0.txt"
"$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --score "$dir/ref.txt" --buffer-lines 3 >"$dir/scores_3.txt"
same_file "--score in groups of 3 lines reads the file to score in step" "$dir/scores_0.txt" "$dir/scores_3.txt"
# The random stream runs on from group to group: eight copies of one line drawn one line at a time at a
# high temperature are not all the same draw (a stream restarted per group would repeat the first).
for i in 1 2 3 4 5 6 7 8; do echo "this is a book"; done >"$dir/same8.txt"
"$translate" --checkpoint "$ckpt" --input "$dir/same8.txt" --sampling --temperature 5 --buffer-lines 1 \
  >"$dir/same8_drawn.txt"
if [ "$(sort -u "$dir/same8_drawn.txt" | wc -l)" -gt 1 ]; then
  pass "--sampling draws on from one group of lines to the next"
else
  fail "--sampling with --buffer-lines 1 drew one translation eight times"; cat "$dir/same8_drawn.txt"
fi
# A line's translation comes out while the input is still open: the first line goes into a FIFO, its
# translation must appear before the second line is written.
mkfifo "$dir/fifo"
"$translate" --checkpoint "$ckpt" --buffer-lines 1 <"$dir/fifo" >"$dir/streamed.txt" 2>"$dir/streamed.err" &
streaming=$!
exec 3>"$dir/fifo"
echo "ich mochte ein bier" >&3
for _ in $(seq 300); do [ -s "$dir/streamed.txt" ] && break; sleep 0.1; done
if [ "$(cat "$dir/streamed.txt")" = "i want a beer" ]; then
  pass "--buffer-lines 1 writes a line's translation before the next line is read"
else
  fail "no translation of the first line while the input stayed open"; cat "$dir/streamed.txt" "$dir/streamed.err"
fi
echo "hello world" >&3
exec 3>&-
if wait "$streaming" && [ "$(tr '\n' '|' <"$dir/streamed.txt")" = "i want a beer|hola mundo|" ]; then
  pass "--buffer-lines 1 translates every line until the input ends"
else
  fail "the streamed translation did not end with both lines"; cat "$dir/streamed.txt" "$dir/streamed.err"
fi
expect "--score whose file runs out within the input's first group" 1 \
  "file to score '$dir/score_two.txt' has 2 lines but the input ('$dir/src.txt') has at least 3" \
  "$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --score "$dir/score_two.txt" --buffer-lines 3
expect "--score whose file has lines past the input's end" 1 \
  "file to score '$dir/ref.txt' has 8 lines but the input ('$dir/score_two.txt') has 2" \
  "$translate" --checkpoint "$ckpt" --input "$dir/score_two.txt" --score "$dir/ref.txt" --buffer-lines 1
expect "--buffer-lines below -1" 2 "--buffer-lines must be -1 (automatic), 0 (all) or positive, not -2" \
  "$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --buffer-lines -2

# ---- --target-prefix: each translation begins with its line of the file ---------------------------
# Line 1's prefix is the start of its own translation (the rest must follow as without it), line 2's
# is another sentence's start ("i want a coke" begins "i want"; "hola" is what line 3 begins with), a
# blank prefix line leaves its sentence free, and a blank input line stays blank whatever its prefix.
printf '%s\n' "ich mochte ein bier" "i love you" "i love you" "" >"$dir/prefix_src.txt"
printf '%s\n' "i want" "hola" "" "te amo" >"$dir/prefixes.txt"
"$translate" --checkpoint "$ckpt" --input "$dir/prefix_src.txt" --target-prefix "$dir/prefixes.txt" \
  >"$dir/prefixed.txt"
if awk 'NR == 1 && $0 == "i want a beer" { ok++ } NR == 2 && $1 == "hola" { ok++ } NR == 3 && $0 == "te amo" { ok++ }
        NR == 4 && $0 == "" { ok++ } END { exit !(NR == 4 && ok == 4) }' "$dir/prefixed.txt"; then
  pass "--target-prefix: translations begin with their prefixes and go on from there"
else
  fail "--target-prefix's translations"; cat "$dir/prefixed.txt"
fi
"$translate" --checkpoint "$ckpt" --input "$dir/prefix_src.txt" --target-prefix "$dir/prefixes.txt" --beam 3 \
  --nbest 3 --buffer-lines 1 >"$dir/prefixed_nbest.txt"
if awk -F'\t' 'NR <= 3 && $2 !~ /^i want( |$)/ { bad = 1 } NR > 3 && NR <= 6 && $2 !~ /^hola( |$)/ { bad = 1 }
        END { exit bad || NR != 12 }' "$dir/prefixed_nbest.txt"; then
  pass "--target-prefix with --beam 3 --nbest 3: every hypothesis begins with the prefix"
else
  fail "--target-prefix's n-best lists"; cat "$dir/prefixed_nbest.txt"
fi
expect "--target-prefix with a file of another length" 1 \
  "target prefix file '$dir/prefixes.txt' has 4 lines but the input ('$dir/src.txt') has 8" \
  "$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --target-prefix "$dir/prefixes.txt"
expect "--target-prefix with --score" 2 "--score scores given translations: --target-prefix does not apply" \
  "$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --score "$dir/ref.txt" --target-prefix "$dir/ref.txt"

# ---- --ensemble: models decoding as one -----------------------------------------------------------
# A model beside itself is that model (the mean of p and p is p): the same n-best lists, with the same
# scores up to float32 rounding in the last printed digit, and the same forced scores.
"$translate" --checkpoint "$ckpt" --input "$dir/src_blank.txt" --beam 3 --nbest 2 >"$dir/single.txt"
"$translate" --checkpoint "$ckpt" --ensemble "$ckpt,$ckpt" --input "$dir/src_blank.txt" --beam 3 --nbest 2 \
  >"$dir/ensembled.txt"
same_scored_lines "--ensemble of the model with itself gives the model's n-best lists" 18 "$dir/single.txt" \
  "$dir/ensembled.txt"
"$translate" --checkpoint "$ckpt" --ensemble "$ckpt" --input "$dir/src.txt" --score "$dir/ref.txt" \
  >"$dir/ensemble_scores.txt"
same_scored_lines "--ensemble of the model with itself scores as the model" 8 "$dir/scores_0.txt" \
  "$dir/ensemble_scores.txt"
expect "--ensemble with an empty path" 2 "--ensemble: an empty path in '$ckpt,'" \
  "$translate" --checkpoint "$ckpt" --ensemble "$ckpt," --input "$dir/src.txt"
expect "--ensemble with a missing checkpoint" 1 "$dir/none.safetensors" \
  "$translate" --checkpoint "$ckpt" --ensemble "$dir/none.safetensors" --input "$dir/src.txt"

# ---- BLEU and chrF ------------------------------------------------------------------------------
bleu_signature="nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.3-miniflow"
chrf_signature="nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.4.3-miniflow"
expect "--reference prints sacreBLEU = 100 for memorised pairs" 0 \
  "BLEU|$bleu_signature = 100.00 100.0/100.0/100.0/100.0 (BP = 1.000" \
  "$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --reference "$dir/ref.txt"
if grep -qxF "chrF2|$chrf_signature = 100.00" "$dir/stderr"; then
  pass "--reference prints chrF = 100 for memorised pairs"
else
  fail "--reference printed no chrF line of 100"; cat "$dir/stderr"
fi
# Swapping two references: "i want a coke" vs "i want a beer" and back keeps 6 of 8 unigrams per pair.
sed -e '1s/beer/coke/' -e '2s/coke/beer/' "$dir/ref.txt" >"$dir/ref_swapped.txt"
expect "--reference with two wrong words gives BLEU below 100" 0 "BLEU|$bleu_signature = " \
  "$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --reference "$dir/ref_swapped.txt"
if grep -q " = 100\.00" "$dir/stderr"; then fail "BLEU or chrF ignored the wrong words"; cat "$dir/stderr"
else pass "BLEU and chrF saw the wrong words"; fi
# The translations are lowercase: a capitalised reference costs cased BLEU, not lowercased BLEU.
sed -e '1s/^i/I/' "$dir/ref.txt" >"$dir/ref_cased.txt"
expect "--reference is cased" 0 "BLEU|$bleu_signature = " \
  "$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --reference "$dir/ref_cased.txt"
if grep -q "^BLEU.* = 100\.00" "$dir/stderr"; then fail "cased BLEU ignored the capital"; cat "$dir/stderr"
else pass "cased BLEU saw the capital"; fi
expect "--lowercase-bleu ignores case" 0 "BLEU|${bleu_signature/case:mixed/case:lc} = 100.00 " \
  "$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --reference "$dir/ref_cased.txt" --lowercase-bleu
expect "--lowercase-bleu without --reference" 2 "--lowercase-bleu needs --reference" \
  "$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --lowercase-bleu

# ---- attention heatmap -------------------------------------------------------------------------
svg="$dir/attention.svg"
expect "--attention-svg writes the heatmap" 0 "" \
  "$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --beam 4 --attention-svg "$svg" --attention-sentence 2
if command -v python3 >/dev/null; then
  if python3 -c 'import xml.dom.minidom,sys; xml.dom.minidom.parse(sys.argv[1])' "$svg"; then
    pass "the heatmap is well-formed XML"
  else
    fail "the heatmap is not well-formed XML"
  fi
else
  echo "SKIPPED: python3 is missing, the heatmap's XML is not parsed"
fi
for token in '>ich<' '>mochte<' '>ein<' '>cola<' '>&lt;eos&gt;<' '<svg'; do
  if grep -qF -- "$token" "$svg"; then pass "the heatmap shows $token"; else fail "the heatmap lacks $token"; fi
done
# Rows are the output tokens + <eos> (row labels are the right-anchored texts), each a distribution
# over the 4 source tokens + <eos>: 5 cells summing to 1 (a mean over heads; a sum would give 4). The
# cells' <title> holds the value with 3 decimals, so a row may be off by 5 * 0.0005.
rows=$(sed -n 's/.*text-anchor="end">\([^<]*\)<.*/\1/p' "$svg" | tr '\n' ' ')
if [ "$rows" = "i want a coke &lt;eos&gt; " ]; then pass "heatmap rows are the output tokens and <eos>"; else
  fail "heatmap rows are '$rows'"; fi
if awk '/text-anchor="end"/ { row++ } match($0, /<title>[0-9.]+<\/title>/) {
      cells[row]++; sum[row] += substr($0, RSTART + 7, RLENGTH - 15) }
    END { for (r = 1; r <= row; r++) if (cells[r] != 5 || sum[r] < 0.997 || sum[r] > 1.003) {
            print "row " r ": " cells[r] " cells summing to " sum[r]; bad = 1 }
          exit bad || row != 5 }' "$svg"; then
  pass "each heatmap row has one cell per source token + <eos>, summing to 1"
else
  fail "heatmap cells"
fi
echo "ich mochte ein wasser" >"$dir/unknown.txt"
expect "--attention-svg on a sentence with an unknown word" 0 "" \
  "$translate" --checkpoint "$ckpt" --input "$dir/unknown.txt" --attention-svg "$svg"
if grep -qF '>wasser (unk)<' "$svg"; then pass "unknown source words are marked (unk)"; else
  fail "the unknown word is not marked"; fi

# ---- word alignment (--alignment) -----------------------------------------------------------------
# Each line is the plain translation, " ||| " and its alignment over the words of the input line (as the
# word vocabulary tokenizes it) and of the printed translation.
"$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --alignment soft >"$dir/soft.txt"
"$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --alignment hard >"$dir/hard.txt"
"$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --alignment 0.3 >"$dir/above.txt"
sed 's/ ||| .*//' "$dir/hard.txt" >"$dir/hard_text.txt"
same_file "--alignment keeps the translations before ' ||| '" "$dir/greedy.txt" "$dir/hard_text.txt"
# soft: one group per target word, one weight per source word, each in [0, 1], a group summing to at most
# 1 (<eos>'s share is left out; 4 decimals each). From those weights, hard must link each target word to
# its heaviest source word, and 0.3 every pair above 0.3, "S-T" in target order.
if paste -d '\t' "$dir/src.txt" "$dir/soft.txt" "$dir/hard.txt" "$dir/above.txt" | awk -F'\t' '
    function after(line) { sub(/^.* \|\|\| /, "", line); return line }
    { sources = split($1, unused, " "); n = split($2, parts, " \\|\\|\\| "); targets = split(parts[1], unused, " ")
      groups = split(after($2), group, " ")
      if (groups != targets) { print NR ": " groups " groups for " targets " target words"; bad = 1 }
      hard = ""; above = ""
      for (t = 1; t <= groups; t++) {
        if (split(group[t], w, ",") != sources) { print NR ": group " t " has " length(w) " weights"; bad = 1 }
        best = 1; sum = 0
        for (s = 1; s <= sources; s++) {
          if (w[s] < 0 || w[s] > 1) bad = 1
          sum += w[s]; if (w[s] > w[best]) best = s
          if (w[s] > 0.3) above = above (above == "" ? "" : " ") (s - 1) "-" (t - 1)
        }
        if (sum > 1.0003) { print NR ": group " t " sums to " sum; bad = 1 }
        hard = hard (hard == "" ? "" : " ") (best - 1) "-" (t - 1)
      }
      if (after($3) != hard) { print NR ": hard is \"" after($3) "\", the weights say \"" hard "\""; bad = 1 }
      if (after($4) != above) { print NR ": 0.3 gives \"" after($4) "\", the weights say \"" above "\""; bad = 1 } }
    END { exit bad || NR != 8 }'; then
  pass "--alignment soft/hard/0.3: a weight per word pair, hard the heaviest per target word, 0.3 those above"
else
  fail "--alignment's three forms disagree"; paste "$dir/soft.txt" "$dir/hard.txt" "$dir/above.txt"
fi
"$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --alignment soft --attention-layer 2 >"$dir/soft_2.txt"
same_file "--attention-layer's default is the last decoder layer (2)" "$dir/soft.txt" "$dir/soft_2.txt"
"$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --alignment soft --attention-layer 1 >"$dir/soft_1.txt"
if cmp -s "$dir/soft.txt" "$dir/soft_1.txt"; then fail "--attention-layer 1 reads the same weights as layer 2"; else
  pass "--attention-layer 1 reads another layer"; fi
# The references are the greedy translations, so aligning them as given (--score) must give the links
# aligning the translations gave; with --nbest, every hypothesis carries its own.
"$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --score "$dir/ref.txt" --alignment hard >"$dir/score_hard.txt"
if [ "$(sed 's/.* ||| //' "$dir/score_hard.txt")" = "$(sed 's/.* ||| //' "$dir/hard.txt")" ] &&
   [ "$(sed 's/ ||| .*//' "$dir/score_hard.txt")" = "$(cut -f1,2 "$dir/scores_0.txt")" ]; then
  pass "--score --alignment aligns the given translations as translating aligned them"
else
  fail "--score --alignment"; paste "$dir/score_hard.txt" "$dir/hard.txt"
fi
"$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --beam 4 --nbest 3 --alignment hard >"$dir/nbest_hard.txt"
if [ "$(sed 's/ ||| .*//' "$dir/nbest_hard.txt")" = "$(cat "$dir/nbest.txt")" ] &&
   [ "$(grep -c ' ||| [0-9]' "$dir/nbest_hard.txt")" -eq 24 ]; then
  pass "--nbest --alignment: each hypothesis line ends with its links"
else
  fail "--nbest --alignment"; cat "$dir/nbest_hard.txt"
fi
printf 'hello world\n\n' | "$translate" --checkpoint "$ckpt" --alignment hard >"$dir/empty_hard.txt"
printf 'hola mundo ||| %s\n ||| \n' "$(sed -n 3p "$dir/hard.txt" | sed 's/.* ||| //')" >"$dir/empty_hard_expected.txt"
same_file "an empty line gives ' ||| ' alone" "$dir/empty_hard_expected.txt" "$dir/empty_hard.txt"
expect "--alignment of an unknown kind" 2 "--alignment must be hard, soft or a threshold between 0 and 1, not 'best'" \
  "$translate" --checkpoint "$ckpt" --alignment best
expect "--alignment 1" 2 "not '1'" "$translate" --checkpoint "$ckpt" --alignment 1
expect "--attention-layer past the decoder's layers" 2 "--attention-layer 3: '$ckpt' has 2 decoder layers" \
  "$translate" --checkpoint "$ckpt" --attention-layer 3
expect "--attention-svg of --attention-layer 1" 0 "" \
  "$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --attention-svg "$svg" --attention-layer 1
if grep -qF 'cross-attention, decoder layer 1 (mean of' "$svg"; then pass "... drawn from that layer"; else
  fail "the heatmap's title does not name layer 1"; fi

# ---- bad input ---------------------------------------------------------------------------------
expect "--help" 0 "" "$translate" --help
expect "no --checkpoint" 2 "--checkpoint is required" "$translate"
expect "unknown flag" 2 "unknown option '--no-such-flag'" "$translate" --checkpoint "$ckpt" --no-such-flag
expect "malformed number" 2 "--beam: 'four' is not a valid number" "$translate" --checkpoint "$ckpt" --beam four
expect "flag without its value" 2 "--beam needs a value" "$translate" --checkpoint "$ckpt" --beam
expect "--beam 0" 2 "--beam must be at least 1" "$translate" --checkpoint "$ckpt" --beam 0
expect "--beam-stop sometimes" 2 "--beam-stop must be finished or exact, not 'sometimes'" \
  "$translate" --checkpoint "$ckpt" --beam-stop sometimes
expect "--min-len -1" 2 "--min-len must be 0 or more, not -1" "$translate" --checkpoint "$ckpt" --min-len -1
expect "--no-repeat-ngram-size -1" 2 "--no-repeat-ngram-size must be 0 (off) or more, not -1" \
  "$translate" --checkpoint "$ckpt" --no-repeat-ngram-size -1
expect "--batch-tokens -1" 2 "--batch-tokens must be 0 or more, not -1" "$translate" --checkpoint "$ckpt" --batch-tokens -1
expect "--nbest above --beam" 2 "--nbest 3 needs a beam at least as wide, but --beam is 2" \
  "$translate" --checkpoint "$ckpt" --beam 2 --nbest 3
expect "--precision fp16" 2 "--precision: expected fp32, bf16 or int8, got 'fp16'" \
  "$translate" --checkpoint "$ckpt" --precision fp16
expect "unknown device" 2 "--device: unknown device 'tpu' (expected cpu, cuda or cuda:N)" \
  "$translate" --checkpoint "$ckpt" --device tpu
# On a GPU, --device cuda must translate exactly as the CPU does; without one it is refused (exit 1).
"$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --beam 4 --device cuda >"$dir/cuda.txt" 2>"$dir/stderr"
status=$?
if [ "$status" -eq 0 ]; then
  same_file "--device cuda: beam 4 on the GPU gives the CPU's translations" "$dir/beam.txt" "$dir/cuda.txt"
elif [ "$status" -eq 1 ] && grep -Eq "^translate: error: --device cuda: (this miniflow was built without CUDA|no CUDA \
device is available)" "$dir/stderr"; then
  pass "--device cuda without a GPU: exit 1, saying why"
else
  fail "--device cuda: exit status $status"; cat "$dir/stderr"
fi
expect "missing checkpoint" 1 "$dir/none.safetensors" "$translate" --checkpoint "$dir/none.safetensors"
head -c 200 "$ckpt" >"$dir/truncated.safetensors"
expect "truncated checkpoint" 1 "$dir/truncated.safetensors" "$translate" --checkpoint "$dir/truncated.safetensors"
printf 'this is not a checkpoint at all' >"$dir/garbage.safetensors"
expect "garbage checkpoint" 1 "$dir/garbage.safetensors" "$translate" --checkpoint "$dir/garbage.safetensors"
expect "a checkpoint that is not a translation model" 1 "is not a miniflow translation checkpoint" \
  "$translate" --checkpoint "$dir/plain.safetensors"
expect "a checkpoint whose config does not fit its tensors" 1 \
  "mismatched: encoder.layers.0.ffn.linear1.weight: checkpoint has [64, 32] float32, model has [128, 32] float32" \
  "$translate" --checkpoint "$dir/other_config.safetensors"
grep -qF "$dir/other_config.safetensors" "$dir/stderr" && pass "... and names the file" || fail "the file is not named"
expect "a checkpoint whose vocabulary does not fit its tensors" 1 \
  "mismatched: src_embed.weight: checkpoint has [26, 32] float32, model has [27, 32] float32" \
  "$translate" --checkpoint "$dir/other_vocab.safetensors"
grep -qF "$dir/other_vocab.safetensors" "$dir/stderr" && pass "... and names the file" || fail "the file is not named"
expect "missing input file" 1 "cannot open input file '$dir/none.txt'" \
  "$translate" --checkpoint "$ckpt" --input "$dir/none.txt"
head -n 7 "$dir/ref.txt" >"$dir/ref7.txt"
expect "reference with fewer lines" 1 "reference file '$dir/ref7.txt' has 7 lines but the input ('$dir/src.txt') has 8" \
  "$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --reference "$dir/ref7.txt"
expect "missing reference file" 1 "cannot open reference file '$dir/none.txt'" \
  "$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --reference "$dir/none.txt"
expect "--attention-sentence past the input" 1 "--attention-sentence 9: the input ('$dir/src.txt') has only 8 lines" \
  "$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --attention-svg "$svg.2" --attention-sentence 9
expect "--output in a missing directory" 1 "$dir/no/such/dir/out.txt" \
  "$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --output "$dir/no/such/dir/out.txt"

# average_checkpoints: three copies average back to the same weights (x + x + x = 3x exactly), so to
# the same translations; its bad usage and bad checkpoints.
# ---- shortlists --------------------------------------------------------------------------------
# The lexicon of the eight memorised pairs: each source word's translations are the words of the pairs
# it occurs in, so a shortlist of the specials (--shortlist-first 4) and ten translations per word
# still holds every reference word of a line, and each line translates as before.
expect "build_lexicon learns the toy pairs' lexicon" 0 "" \
  "$build_lexicon" --checkpoint "$ckpt" --source "$dir/src.txt" --target "$dir/ref.txt" --output "$dir/lex.s2t"
grep -qF "8 pairs, " "$dir/stdout" && pass "... says what it read" || { fail "build_lexicon's summary"; cat "$dir/stdout"; }
grep -qE '^beer bier [0-9.e-]+$' "$dir/lex.s2t" && pass "... as \"target source probability\" lines" ||
  { fail "no 'beer bier' line in the lexicon"; head "$dir/lex.s2t"; }
"$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --shortlist "$dir/lex.s2t" --shortlist-first 4 \
  --shortlist-best 10 >"$dir/shortlist.txt"
same_file "--shortlist translates the memorised pairs alike" "$dir/ref.txt" "$dir/shortlist.txt"
"$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --beam 4 --shortlist "$dir/lex.s2t" >"$dir/shortlist_beam.txt"
same_file "... with beam 4 too" "$dir/ref.txt" "$dir/shortlist_beam.txt"
expect "--shortlist-best without --shortlist" 2 "--shortlist-first and --shortlist-best need --shortlist" \
  "$translate" --checkpoint "$ckpt" --shortlist-best 5
expect "--shortlist with --score" 2 "--shortlist does not apply" \
  "$translate" --checkpoint "$ckpt" --shortlist "$dir/lex.s2t" --score "$dir/ref.txt"
expect "--shortlist of a missing file" 1 "$dir/none.s2t" "$translate" --checkpoint "$ckpt" --shortlist "$dir/none.s2t"
printf 'beer katze 0.5\n' >"$dir/alien.s2t"
expect "--shortlist of another model's lexicon" 1 "line 1: the source unit 'katze' is not in the model's" \
  "$translate" --checkpoint "$ckpt" --shortlist "$dir/alien.s2t"
expect "build_lexicon without --output" 2 "--output is required" \
  "$build_lexicon" --checkpoint "$ckpt" --source "$dir/src.txt" --target "$dir/ref.txt"
# fast_align's options: the toy pairs' lexicon again, and the shortlists still hold every word needed.
expect "build_lexicon as fast_align -d -o -v" 0 "" \
  "$build_lexicon" --checkpoint "$ckpt" --source "$dir/src.txt" --target "$dir/ref.txt" --output "$dir/lex_fa.s2t" \
  --diagonal-tension 4 --optimize-tension --dirichlet-alpha 0.01
grep -qE '^pass 5: perplexity [0-9.]+, diagonal tension [0-9.]+ next$' "$dir/stdout" &&
  pass "... printing each pass's perplexity and tension" || { fail "no pass 5 line"; cat "$dir/stdout"; }
"$translate" --checkpoint "$ckpt" --input "$dir/src.txt" --shortlist "$dir/lex_fa.s2t" --shortlist-first 4 \
  --shortlist-best 10 >"$dir/shortlist_fa.txt"
same_file "... and --shortlist with it translates the memorised pairs alike" "$dir/ref.txt" "$dir/shortlist_fa.txt"
expect "build_lexicon --optimize-tension alone" 2 "--optimize-tension needs a --diagonal-tension" \
  "$build_lexicon" --checkpoint "$ckpt" --source "$dir/src.txt" --target "$dir/ref.txt" --output "$dir/lex2.s2t" \
  --optimize-tension
expect "build_lexicon --diagonal-tension inf" 2 "--diagonal-tension must be 0 or more, not inf" \
  "$build_lexicon" --checkpoint "$ckpt" --source "$dir/src.txt" --target "$dir/ref.txt" --output "$dir/lex2.s2t" \
  --diagonal-tension inf
expect "build_lexicon --null-probability 1" 2 "--null-probability must be in [0, 1), not 1" \
  "$build_lexicon" --checkpoint "$ckpt" --source "$dir/src.txt" --target "$dir/ref.txt" --output "$dir/lex2.s2t" \
  --diagonal-tension 4 --null-probability 1
head -3 "$dir/ref.txt" >"$dir/ref3.txt"
expect "build_lexicon of files of different lengths" 1 "ref3.txt" \
  "$build_lexicon" --checkpoint "$ckpt" --source "$dir/src.txt" --target "$dir/ref3.txt" --output "$dir/lex2.s2t"
[ ! -e "$dir/lex2.s2t" ] && pass "... and writes nothing" || fail "a failed build_lexicon wrote its output"

expect "average_checkpoints of three copies" 0 "" "$average" --output "$dir/avg.safetensors" "$ckpt" "$ckpt" "$ckpt"
grep -qF "averaged 3 checkpoints of" "$dir/stdout" && pass "... says what it wrote" || fail "no summary line"
"$translate" --checkpoint "$dir/avg.safetensors" --input "$dir/src.txt" >"$dir/avg.txt"
same_file "the average of copies translates as the checkpoint does" "$dir/greedy.txt" "$dir/avg.txt"
expect "average_checkpoints without checkpoints" 2 "give the checkpoints to average" \
  "$average" --output "$dir/avg2.safetensors"
expect "average_checkpoints without --output" 2 "--output is required" "$average" "$ckpt"
expect "average_checkpoints of a missing checkpoint" 1 "$dir/none.safetensors" \
  "$average" --output "$dir/avg2.safetensors" "$ckpt" "$dir/none.safetensors"
expect "average_checkpoints of a checkpoint of another model" 1 "$dir/other_vocab.safetensors" \
  "$average" --output "$dir/avg2.safetensors" "$ckpt" "$dir/other_vocab.safetensors"
[ ! -e "$dir/avg2.safetensors" ] && pass "... and writes nothing" || fail "a failed average wrote its output"

echo "$passed passed, $failures failed"
[ "$failures" -eq 0 ]
