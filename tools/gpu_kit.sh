#!/usr/bin/env bash
# The GPU check in two steps, for a bare, offline GPU machine (nvcc and PyTorch, no OpenBLAS, fmt or
# doctest, at most 64 MiB carried in with the working tree):
#
#   bash tools/gpu_kit.sh pack [--build DIR] [--kit DIR]    on the development machine
#   bash gpu-kit/gpu_kit.sh run OUTDIR [--deadline SECONDS] [--parts LIST]    on the GPU machine
#
# pack builds the CUDA variant (sm_80 and sm_90) in build-gpu/ (or DIR) and gathers into gpu-kit/ (git-
# ignored) one compressed payload: the CUDA test suites, the tools, libminiflow and its CUDA backend,
# the shared libraries they load that such a machine lacks (from ldd: OpenBLAS, fmt, libstdc++, ...;
# glibc too, used only where the machine's is older), the reference data the tests read, and this
# script. Prebuilt rather than built there: no build minutes on the GPU's clock and no dependence on its
# compilers. CUDA's own libraries (cudart, cuBLAS) are the GPU machine's, from its CUDA toolkit.
#
# run unpacks the payload and runs each part under its own time limit, never stopping at a failure,
# all within --deadline seconds (default 540, inside the device tool's 10-minute command limit): the
# GPU and driver, the kit's binaries, test_cuda and the registry suite (every op on the GPU against its
# reference, its backward against the CPU's), NCCL collectives and data-parallel gradients on the GPU
# (a world of one process), test_cuda_training, the
# suites with CUDA parts, train_transformer --device cuda on the toy corpus (8/8 correct), translate
# --device cuda against the CPU's translations, compute-sanitizer memcheck over the registry suite's
# device checks and racecheck over the reduction kernels, and bench_transformer --device cuda beside
# PyTorch's step on the same GPU, in fp32 and under bfloat16 autocast.
# --parts runs only some of them (comma-separated names from the summary). OUTDIR gets summary.md
# (also printed) and a few logs. Exit 0 when every part passed, or, without a GPU, when every GPU part
# was skipped with its reason; compute-sanitizer refusing the device counts as unavailable, not failed.
set -uo pipefail

usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "gpu_kit.sh: $*" >&2; exit 1; }

readonly kMaxKitBytes=$((60 * 1024 * 1024))  # the device tool carries 64 MiB, the working tree included
readonly kPayload=payload.tar.gz
# Executables the kit carries: the suites with CUDA parts, the tools, and the toy checkpoint maker that
# tools_translate.sh needs.
readonly kTests="test_cuda test_ops_registry test_cuda_training test_distributed test_tensor test_ops test_properties
  test_nn test_transformer test_optim"
readonly kTools="train_transformer translate average_checkpoints quantize_checkpoint build_lexicon bench_transformer"
# Libraries the GPU machine provides itself: its driver and CUDA toolkit, and the kernel's vDSO.
readonly kHostLibraries='^(linux-vdso|libcuda\.|libcudart\.|libcublas|libcublasLt|libnccl|libnvidia)'
readonly kGlibc='^(ld-linux-x86-64\.so|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libmvec\.so)'

# ---- pack ---------------------------------------------------------------------------------------------

pack() {
  local build=build-gpu kit=gpu-kit
  while (($#)); do
    case "$1" in
      --build) build=${2:?--build needs a directory}; shift 2 ;;
      --kit) kit=${2:?--kit needs a directory}; shift 2 ;;
      *) usage ;;
    esac
  done
  cd "$(dirname "$0")/.." || exit 1
  command -v nvcc >/dev/null || die "pack needs nvcc (the CUDA toolkit) to build the CUDA variant"
  bash tools/install_packages.sh g++ meson ninja-build pkg-config libopenblas-dev libfmt-dev \
    nlohmann-json3-dev doctest-dev libsentencepiece-dev || exit 1
  if [ ! -f "$build/build.ninja" ]; then
    meson setup "$build" -Dcuda=enabled -Dgpu_arch='80;90' || die "meson setup $build failed"
  fi
  local options
  options=$(meson introspect --buildoptions "$build") || die "$build is not a meson build folder"
  python3 - "$options" <<'EOF' || die "$build is not built for sm_80 and sm_90 (meson configure $build -Dgpu_arch='80;90')"
import json, sys
options = {o["name"]: o["value"] for o in json.loads(sys.argv[1])}
sys.exit(0 if {"80", "90"} <= set(str(options.get("gpu_arch", "")).split(";")) else 1)
EOF
  grep -q "MF_CUDA=1" "$build/build.ninja" || die "$build was configured without CUDA (meson configure $build -Dcuda=enabled)"
  bash tools/refresh_cuda_objects.sh "$build" || die "could not refresh the CUDA objects of $build"
  ninja -C "$build" || die "ninja -C $build failed"

  local stage
  stage=$(mktemp -d) || exit 1
  trap 'rm -rf "$stage"' RETURN
  mkdir -p "$stage"/{bin,libexec,lib/glibc,scripts,tests} || exit 1
  local name
  for name in $kTests; do cp "$build/tests/$name" "$stage/libexec/" || die "missing $build/tests/$name"; done
  for name in $kTools; do cp "$build/tools/$name" "$stage/libexec/" || die "missing $build/tools/$name"; done
  cp "$build/tests/make_toy_checkpoint" "$stage/libexec/" || exit 1
  cp "$build/libminiflow.so" "$build/libminiflow_cuda.so" "$stage/lib/" || exit 1
  for name in $(ls "$stage/libexec"); do write_wrapper "$stage/bin/$name" "$name"; done

  # Every library the binaries load, as ldd resolves it here: the GPU machine's own CUDA stays out.
  local soname path dir
  while read -r soname path; do
    [[ -z "$path" || "$soname" =~ $kHostLibraries || "$soname" =~ ^libminiflow ]] && continue
    if [[ "$soname" =~ $kGlibc ]]; then dir=lib/glibc; else dir=lib; fi
    cp -L "$path" "$stage/$dir/$soname" || die "cannot copy $path"
  done < <(for f in "$stage"/libexec/* "$stage"/lib/libminiflow*.so; do ldd "$f"; done |
           awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 } $1 ~ /^\/.*ld-linux/ { n = split($1, p, "/"); print p[n], $1 }' |
           sort -u)
  [ -f "$stage/lib/glibc/libc.so.6" ] || die "ldd did not name libc.so.6"

  cp -r tests/data "$stage/tests/" || exit 1
  cp tests/tools_train.sh tests/tools_translate.sh tools/bench_pytorch.py "$stage/scripts/" || exit 1
  # The newest glibc symbol version anything in the kit needs: run uses the kit's glibc on older machines.
  objdump -T "$stage"/libexec/* "$stage"/lib/*.so* 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' |
    sort -uV | tail -n 1 >"$stage/glibc_needed"
  {
    echo "built $(date -u '+%Y-%m-%d %H:%M UTC') from $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(
      git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "build: $build ($(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/CUDA \1/p'), gpu_arch 80;90)"
    echo "needs glibc $(cat "$stage/glibc_needed") (or uses its own)"
  } >"$stage/manifest.txt"

  rm -rf "$kit" && mkdir -p "$kit" || exit 1
  tar -C "$stage" -czf "$kit/$kPayload" . || die "tar failed"
  cp tools/gpu_kit.sh "$kit/gpu_kit.sh"
  cp "$stage/manifest.txt" "$kit/manifest.txt"
  local bytes
  bytes=$(du -sb "$kit" | cut -f1)
  echo "gpu_kit.sh: $kit holds $(awk -v b="$bytes" 'BEGIN { printf "%.1f MiB", b / 1048576 }') (limit $((kMaxKitBytes / 1048576)) MiB;" \
       "unpacked $(du -sh "$stage" | cut -f1))"
  ((bytes <= kMaxKitBytes)) || die "$kit is over the limit"
  echo "on the GPU machine (carry $kit): bash $kit/gpu_kit.sh run OUTDIR"
}

# bin/NAME: runs libexec/NAME with the kit's libraries, through the kit's glibc where run decided so.
write_wrapper() {
  cat >"$1" <<EOF
#!/bin/sh
kit=\$(cd "\$(dirname "\$0")/.." && pwd)
if [ -n "\${MF_KIT_LOADER:-}" ]; then
  exec "\$MF_KIT_LOADER" --library-path "\$MF_KIT_LIBRARY_PATH" "\$kit/libexec/$2" "\$@"
fi
LD_LIBRARY_PATH="\${MF_KIT_LIBRARY_PATH:-\$kit/lib}" exec "\$kit/libexec/$2" "\$@"
EOF
  chmod +x "$1"
}

# ---- run ----------------------------------------------------------------------------------------------

declare -a part_names=() part_results=() part_seconds=() part_details=()
out="" work="" kit="" deadline_at=0 gpu_reason="" only=""

record() {  # name result seconds detail
  part_names+=("$1"); part_results+=("$2"); part_seconds+=("$3"); part_details+=("$4")
  printf '%-14s %-11s %5ss  %s\n' "$1" "$2" "$3" "$4"
}

wanted() { [ -z "$only" ] || [[ ",$only," == *",$1,"* ]]; }

# Runs one part: part NAME LIMIT LOG NEEDS_GPU FUNCTION. FUNCTION runs under `timeout`, appends to LOG
# and prints its one-line detail last; its status decides PASS (0), UNAVAILABLE (3) or FAIL.
part() {
  local name=$1 limit=$2 log=$3 needs_gpu=$4 fn=$5
  wanted "$name" || return 0
  if ((needs_gpu)) && [ -n "$gpu_reason" ]; then record "$name" SKIPPED 0 "no GPU: $gpu_reason"; return 0; fi
  local left=$((deadline_at - SECONDS))
  if ((left < 10)); then record "$name" "NOT RUN" 0 "out of time (--deadline)"; return 0; fi
  ((limit > left)) && limit=$left
  local start=$SECONDS detail status
  echo "===== $name (limit ${limit}s) =====" >>"$out/$log"
  export -f "$fn"
  timeout --kill-after=10 "$limit" bash -c "$fn" >"$work/part.out" 2>&1
  status=$?
  cat "$work/part.out" >>"$out/$log"
  detail=$(tail -n 1 "$work/part.out")
  local seconds=$((SECONDS - start))
  case "$status" in
    0) record "$name" PASS "$seconds" "$detail" ;;
    3) record "$name" UNAVAILABLE "$seconds" "$detail" ;;
    124 | 137) record "$name" FAIL "$seconds" "timed out after ${limit}s; $detail" ;;
    *) record "$name" FAIL "$seconds" "exit $status; $detail" ;;
  esac
}

# The parts. Each runs in the kit's folder with KIT, WORK, OUT and DEVICE (cuda; cpu in a rehearsal)
# exported.
part_kit() {
  # Every library resolves into the kit, the CUDA toolkit or (for glibc and the driver) the system.
  local resolved missing outside
  resolved=$(LD_LIBRARY_PATH="$MF_KIT_LIBRARY_PATH" ldd libexec/* lib/*.so* 2>&1 | awk '$2 == "=>" { print $1, $3 }' | sort -u)
  missing=$(echo "$resolved" | awk '$2 == "not" { print $1 }' | xargs)
  outside=$(echo "$resolved" | awk -v kit="$KIT/" -v host="$kHostLibraries" -v glibc="$kGlibc" \
    '$2 != "not" && index($2, kit) != 1 && $1 !~ host && $1 !~ glibc { print $1 }' | xargs)
  [ -z "$missing" ] || { echo "libraries not found: $missing"; return 1; }
  [ -z "$outside" ] || { echo "libraries taken from the machine, not the kit: $outside"; return 1; }
  bin/train_transformer --version || { echo "the kit's binaries do not start (see the log)"; return 1; }
  echo "binaries start ($MF_KIT_GLIBC): $(bin/train_transformer --version | sed -n 2p)"
}
part_test_cuda() {
  (bin/test_cuda; runtime=$?; bin/test_ops_registry; exit $((runtime | $?))) 2>&1 | tee "$WORK/test_cuda.out"
  local status=${PIPESTATUS[0]}
  local summary
  summary=$(grep -o 'cuda:0: [0-9]* samples checked' "$WORK/test_cuda.out")
  if grep -q "SKIPPED" "$WORK/test_cuda.out"; then echo "miniflow sees no GPU although nvidia-smi does"; return 1; fi
  ((status == 0)) || { echo "failures (see tests.log)"; return 1; }
  echo "every op on cuda:0 against its reference and the CPU's backward: ${summary:-passed}"
}
part_nccl() {
  bin/test_distributed -tc='nccl*' 2>&1 | tee "$WORK/nccl.out"
  local status=${PIPESTATUS[0]}
  if grep -q "SKIPPED" "$WORK/nccl.out"; then echo "skipped: $(grep -o 'SKIPPED.*' "$WORK/nccl.out" | head -n 1)"; return 1; fi
  ((status == 0)) || { echo "failures (see tests.log)"; return 1; }
  echo "all_reduce, broadcast, all_gather, barrier and DistributedDataParallel over NCCL on cuda:0"
}
part_test_cuda_training() {
  bin/test_cuda_training 2>&1 | tee "$WORK/training.out"
  local status=${PIPESTATUS[0]}
  if grep -q "SKIPPED" "$WORK/training.out"; then echo "a CUDA part was skipped"; return 1; fi
  ((status == 0)) || { echo "failures (see tests.log)"; return 1; }
  echo "toy corpus trained on cuda; CPU and CUDA losses agree"
}
part_suites() {
  local failed=""
  for suite in test_tensor test_ops test_properties test_nn test_transformer test_optim; do
    bin/$suite || failed+=" $suite"
  done
  bash scripts/tools_train.sh bin/train_transformer bin/translate || failed+=" tools_train"
  bash scripts/tools_translate.sh bin/translate bin/make_toy_checkpoint bin/average_checkpoints bin/quantize_checkpoint \
    bin/build_lexicon ||
    failed+=" tools_translate"
  [ -z "$failed" ] || { echo "failed:$failed"; return 1; }
  echo "test_tensor, test_ops, test_properties, test_nn, test_transformer, test_optim, tools_train.sh, tools_translate.sh"
}
part_train() {
  bin/train_transformer --device "$DEVICE" --checkpoint "$WORK/toy.safetensors" 2>&1 | tee "$WORK/train.out"
  local status=${PIPESTATUS[0]}
  local verdict
  verdict=$(tail -n 1 "$WORK/train.out")
  ((status == 0)) && [ "$verdict" = "8/8 correct" ] || { echo "exit $status, last line '$verdict'"; return 1; }
  echo "8/8 correct"
}
part_translate() {
  [ -f "$WORK/toy.safetensors" ] || { echo "no checkpoint: the train part did not pass"; return 1; }
  sed -n 's/^\(.*[^ ]\) *-> greedy:.*/\1/p' "$WORK/train.out" >"$WORK/toy.src"
  [ -s "$WORK/toy.src" ] || { echo "no sources in train_transformer's output"; return 1; }
  local differ=""
  for decoding in "--beam 1" "--beam 4"; do
    for device in cpu "$DEVICE"; do
      bin/translate --checkpoint "$WORK/toy.safetensors" --device "$device" $decoding --input "$WORK/toy.src" \
        --output "$WORK/toy.$device.out" || { echo "translate --device $device failed"; return 1; }
    done
    echo "--- $decoding: cpu vs $DEVICE"; paste "$WORK/toy.cpu.out" "$WORK/toy.$DEVICE.out"
    cmp -s "$WORK/toy.cpu.out" "$WORK/toy.$DEVICE.out" || differ+=" ($decoding)"
  done
  [ -z "$differ" ] || { echo "the $DEVICE translations differ from the CPU's$differ"; return 1; }
  echo "$(wc -l <"$WORK/toy.src") sentences, greedy and beam 4: the CPU's translations"
}
sanitizer() {  # tool, then the environment for the registry suite's device checks
  local tool=$1; shift
  command -v compute-sanitizer >/dev/null || { echo "compute-sanitizer not found"; return 3; }
  env "$@" compute-sanitizer --tool "$tool" --target-processes all --error-exitcode 86 bin/test_ops_registry \
    -tc='every op matches*,every differentiable op*on each other device*' >"$WORK/$tool.out" 2>&1
  local status=$?
  head -c 4000000 "$WORK/$tool.out"
  if grep -qi "device not supported\|not supported on this device" "$WORK/$tool.out"; then
    echo "unavailable: compute-sanitizer says the device is not supported"; return 3
  fi
  ((status == 0)) || { echo "exit $status: $(grep -m1 -E 'ERROR SUMMARY|Error|error' "$WORK/$tool.out")"; return 1; }
  echo "$(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$WORK/$tool.out" || echo 'no errors')"
}
part_memcheck() { sanitizer memcheck; }
part_racecheck() {
  sanitizer racecheck \
    MF_TEST_OPS=sum,mean,var,amax,amin,max_dim,min_dim,argmax,softmax,log_softmax,layer_norm,cross_entropy
}
bench_at_precision() {
  local precision=$1 table=$2 failed=""
  # Each side under a limit of its own, so that one slow config still leaves the other's figures.
  timeout 80 bin/bench_transformer --device "$DEVICE" --precision "$precision" --steps 20 --json \
    >"$WORK/miniflow.jsonl" || failed+=" miniflow"
  timeout 60 python3 scripts/bench_pytorch.py --device "$DEVICE" --precision "$precision" --steps 20 --json \
    >"$WORK/pytorch.jsonl" || failed+=" pytorch"
  cat "$WORK/miniflow.jsonl" "$WORK/pytorch.jsonl"
  # $table: the table; the last line printed: the step-time ratios.
  python3 - "$WORK/miniflow.jsonl" "$WORK/pytorch.jsonl" "$OUT/$table" "$precision" <<'EOF' || failed+=" (no results)"
import json, sys
def read(path):
    with open(path) as f:
        return {r["config"]: r for r in (json.loads(line) for line in f if line.strip().startswith("{"))}
mf, pt = read(sys.argv[1]), read(sys.argv[2])
def cell(r, key):
    return f"{r[key]:.1f}" if key in r else "-"
rows = [f"{sys.argv[4]}:", "", "| config | miniflow ms/step | PyTorch ms/step | miniflow / PyTorch | GEMM GFLOP/s (miniflow, PyTorch) |",
        "|---|---|---|---|---|"]
ratios = []
for c in [c for c in ("seed", "small", "base") if c in mf or c in pt]:
    m, p = mf.get(c, {}), pt.get(c, {})
    ratio = m["ms_per_step"] / p["ms_per_step"] if m and p else None
    if ratio:
        ratios.append(f"{c} {ratio:.2f}x")
    shown = f"{ratio:.2f}x" if ratio else "-"
    rows.append(f"| {c} | {cell(m, 'ms_per_step')} | {cell(p, 'ms_per_step')} | {shown} | "
                f"{cell(m, 'sgemm_gflops')}, {cell(p, 'sgemm_gflops')} |")
with open(sys.argv[3], "w") as f:
    f.write("\n".join(rows) + "\n")
print("\n".join(rows))
print("step time vs PyTorch: " + (", ".join(ratios) if ratios else "no config ran on both"))
EOF
  [ -z "$failed" ] || { echo "failed:$failed"; return 1; }
}
# fp32, then bf16 autocast on both sides (cuBLAS's CUBLAS_COMPUTE_32F_FAST_16BF against torch.autocast).
part_bench() { bench_at_precision fp32 bench.md; }
part_bench_bf16() { bench_at_precision bf16 bench_bf16.md; }

run() {
  [ $# -ge 1 ] || usage
  out=$1; shift
  local deadline=540
  while (($#)); do
    case "$1" in
      --deadline) deadline=${2:?}; shift 2 ;;
      --parts) only=${2:?}; shift 2 ;;
      *) usage ;;
    esac
  done
  [[ "$deadline" =~ ^[0-9]+$ ]] || usage
  local here
  here=$(cd "$(dirname "$0")" && pwd)
  [ -f "$here/$kPayload" ] || die "no $kPayload beside this script: run the copy in the kit folder (made by pack)"
  mkdir -p "$out" && out=$(cd "$out" && pwd) || die "cannot create $out"
  deadline_at=$((SECONDS + deadline))
  kit=$(mktemp -d "${TMPDIR:-/tmp}/miniflow-gpu-kit.XXXXXX") || exit 1
  work="$kit/work"
  mkdir -p "$work"
  tar -C "$kit" -xzf "$here/$kPayload" || die "cannot unpack $here/$kPayload"
  cd "$kit" || exit 1

  {
    echo "GPU kit run, $(date -u '+%Y-%m-%d %H:%M UTC'), on $(hostname)"
    cat manifest.txt
    if command -v nvidia-smi >/dev/null; then
      nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv 2>&1
    fi
    echo "CUDA toolkit: $(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p' || echo none)"
    echo "glibc: $(getconf GNU_LIBC_VERSION 2>/dev/null)"
    echo "python: $(python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -n 1)"
  } >"$out/machine.txt" 2>&1

  # MF_KIT_REHEARSE=1 runs the GPU parts' own steps on the CPU (with --parts: those that have no CUDA
  # tests of their own), so that the kit's plumbing is tested where no GPU is.
  gpu_reason="" DEVICE=cuda
  if [ "${MF_KIT_REHEARSE:-0}" = 1 ]; then
    DEVICE=cpu
  elif ! command -v nvidia-smi >/dev/null; then
    gpu_reason="nvidia-smi not found"
  elif ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    gpu_reason="nvidia-smi lists no GPU ($(nvidia-smi -L 2>&1 | head -n 1))"
  fi

  # Libraries: the kit's, then the machine's CUDA toolkit (cudart, cuBLAS); the kit's glibc and its
  # loader only where the machine's glibc is older than the kit needs.
  local cuda_libs="" dir
  for dir in "$(dirname "$(command -v nvcc 2>/dev/null || echo /nonexistent/bin/nvcc)")/../lib64" \
             "$(dirname "$(command -v nvcc 2>/dev/null || echo /nonexistent/bin/nvcc)")/../lib" \
             /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$dir" ] && cuda_libs+=":$(cd "$dir" && pwd)"
  done
  # NCCL from PyTorch's nvidia-nccl wheel where the toolkit has none (miniflow loads it at run time).
  dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  [ -n "$dir" ] && [ -d "$dir" ] && cuda_libs+=":$dir"
  export MF_KIT_LIBRARY_PATH="$kit/lib$cuda_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  local have needed
  have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')
  needed=$(cat glibc_needed)
  # MF_KIT_OWN_GLIBC=1 takes the kit's glibc whatever the machine's (to test that path).
  if [ "${MF_KIT_OWN_GLIBC:-0}" != 1 ] && [ -n "$have" ] &&
     [ "$(printf '%s\n%s\n' "$needed" "$have" | sort -V | head -n 1)" = "$needed" ]; then
    unset MF_KIT_LOADER
    export MF_KIT_GLIBC="the machine's glibc $have"
  else
    export MF_KIT_LOADER="$kit/lib/glibc/ld-linux-x86-64.so.2"
    MF_KIT_LIBRARY_PATH="$kit/lib/glibc:$MF_KIT_LIBRARY_PATH"
    export MF_KIT_GLIBC="the kit's glibc, the machine has ${have:-unknown}"
  fi
  echo "needs glibc $needed: runs on $MF_KIT_GLIBC" >>"$out/machine.txt"
  export KIT="$kit" WORK="$work" OUT="$out" DEVICE kHostLibraries kGlibc
  export -f sanitizer bench_at_precision

  cat "$out/machine.txt"
  echo
  if [ -n "$gpu_reason" ]; then record gpu SKIPPED 0 "no GPU: $gpu_reason"
  elif [ "$DEVICE" = cpu ]; then record gpu REHEARSAL 0 "MF_KIT_REHEARSE=1: GPU parts on the CPU"
  else record gpu INFO 0 "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1)"; fi
  part kit 60 tests.log 0 part_kit
  part test_cuda 120 tests.log 1 part_test_cuda
  part nccl 60 tests.log 1 part_nccl
  part train 90 tools.log 1 part_train
  part translate 60 tools.log 1 part_translate
  part test_cuda_training 150 tests.log 1 part_test_cuda_training
  part bench 150 bench.log 1 part_bench
  part bench_bf16 150 bench.log 1 part_bench_bf16
  part suites 150 tests.log 1 part_suites
  part memcheck 240 sanitizer.log 1 part_memcheck
  part racecheck 120 sanitizer.log 1 part_racecheck

  local i failed=0 ran=0
  {
    echo "# GPU kit: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    sed 's/^/    /' "$out/machine.txt"
    echo
    echo "| part | result | seconds | detail |"
    echo "|---|---|---|---|"
    for i in "${!part_names[@]}"; do
      echo "| ${part_names[i]} | ${part_results[i]} | ${part_seconds[i]} | ${part_details[i]//|/\\|} |"
    done
    for table in bench.md bench_bf16.md; do [ -f "$out/$table" ] && { echo; cat "$out/$table"; }; done
  } >"$out/summary.md"
  for i in "${!part_results[@]}"; do
    case "${part_results[i]}" in
      FAIL | "NOT RUN") failed=1 ;;
      PASS) ran=1 ;;
    esac
  done
  local log
  for log in "$out"/*.log; do [ -f "$log" ] && truncate -s '<15M' "$log"; done  # the device tool returns 16 MiB a file
  echo
  cat "$out/summary.md"
  rm -rf "$kit"
  ((failed == 0)) || return 1
  if [ -z "$gpu_reason" ] && ((ran == 0)); then return 1; fi
  return 0
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) shift; run "$@" ;;
  -h | --help) usage ;;
  *) usage ;;
esac
