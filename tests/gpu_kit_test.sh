#!/usr/bin/env bash
# tools/gpu_kit.sh on the development machine: pack gathers a kit under the size limit from this build;
# run, without a GPU, reports every GPU part as skipped with its reason and exits 0; a rehearsal runs
# the train and translate parts on the CPU through the kit's binaries (on the kit's own glibc too); a
# kit missing a library it needs fails its check by name. Skipped (exit 77) for a build without CUDA.
#   gpu_kit_test.sh SOURCE_ROOT BUILD_DIR
set -u
source_root=$1 build=$2
if ! grep -q "MF_CUDA=1" "$build/build.ninja"; then
  echo "SKIPPED: $build is built without CUDA, so there is no GPU kit to pack"; exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0 passed=0
check() {  # description, then a command that must succeed
  local what=$1; shift
  if "$@"; then echo "ok: $what"; passed=$((passed + 1)); else echo "FAIL: $what"; failures=$((failures + 1)); return 1; fi
}
summary_has() { grep -qE "$1" "$2/summary.md"; }

bash "$source_root/tools/gpu_kit.sh" pack --build "$build" --kit "$work/kit" >"$work/pack.log" 2>&1
check "pack exits 0" test $? -eq 0 || tail -n 20 "$work/pack.log"
check "pack prints the kit's size" grep -qE "holds [0-9.]+ MiB \(limit 60 MiB" "$work/pack.log"
bytes=$(du -sb "$work/kit" | cut -f1)
check "the kit is under 60 MiB ($bytes bytes)" test "$bytes" -le $((60 * 1024 * 1024))
tar -tzf "$work/kit/payload.tar.gz" >"$work/contents"
for file in bin/test_cuda libexec/test_cuda bin/test_cuda_training bin/train_transformer bin/translate \
            bin/bench_transformer lib/libminiflow.so lib/libminiflow_cuda.so lib/libopenblas.so.0 lib/libfmt.so.9 \
            lib/glibc/libc.so.6 lib/glibc/ld-linux-x86-64.so.2 tests/data/transformer_tiny.safetensors \
            scripts/tools_train.sh scripts/bench_pytorch.py bin/test_distributed glibc_needed; do
  check "the kit holds $file" grep -qx "./$file" "$work/contents"
done
check "the kit leaves cuBLAS to the GPU machine" bash -c "! grep -q libcublas '$work/contents'"

if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "a GPU is present: the no-GPU report is not checked here"
else
  bash "$work/kit/gpu_kit.sh" run "$work/out" >"$work/run.log" 2>&1
  check "run without a GPU exits 0" test $? -eq 0 || cat "$work/run.log"
  check "the kit's binaries start" summary_has '^\| kit \| PASS \|' "$work/out"
  for part in gpu test_cuda nccl train translate test_cuda_training bench bench_bf16 suites memcheck racecheck; do
    check "run skips $part, saying why" summary_has "^\| $part \| SKIPPED \| 0 \| no GPU: .+ \|$" "$work/out"
  done
fi

MF_KIT_REHEARSE=1 MF_KIT_OWN_GLIBC=1 bash "$work/kit/gpu_kit.sh" run "$work/rehearsal" --parts kit,train,translate \
  >"$work/rehearsal.log" 2>&1
check "a rehearsal on the kit's own glibc exits 0" test $? -eq 0 || cat "$work/rehearsal.log"
check "it ran on the kit's glibc" summary_has "^\| kit \| PASS \| .*the kit's glibc" "$work/rehearsal"
check "the toy corpus trains through the kit" summary_has '^\| train \| PASS \| .* \| 8/8 correct \|$' "$work/rehearsal"
check "translate runs through the kit" summary_has '^\| translate \| PASS \| .* \| 8 sentences' "$work/rehearsal"

# A kit that lacks fmt: its check names the library (the development machine has it, the GPU machine would not).
mkdir "$work/broken" "$work/unpacked" && tar -C "$work/unpacked" -xzf "$work/kit/payload.tar.gz" &&
  rm "$work/unpacked/lib/libfmt.so.9" && tar -C "$work/unpacked" -czf "$work/broken/payload.tar.gz" . &&
  cp "$work/kit/gpu_kit.sh" "$work/broken/"
MF_KIT_REHEARSE=1 bash "$work/broken/gpu_kit.sh" run "$work/broken-out" --parts kit >"$work/broken.log" 2>&1
check "a kit missing a library fails" test $? -eq 1
check "... naming it" summary_has '^\| kit \| FAIL \| .*libfmt\.so\.9' "$work/broken-out"

bash "$source_root/tools/gpu_kit.sh" run "$work/nowhere" >"$work/nopayload.log" 2>&1
check "run without a payload beside the script exits 1" test $? -eq 1
check "... saying so" grep -q "no payload.tar.gz beside this script" "$work/nopayload.log"
bash "$source_root/tools/gpu_kit.sh" frobnicate >/dev/null 2>&1
check "an unknown command is bad usage (exit 2)" test $? -eq 2

echo "$passed passed, $failures failed"
[ "$failures" -eq 0 ]
