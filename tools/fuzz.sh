#!/usr/bin/env bash
# Runs miniflow's libFuzzer targets (fuzz/) on a scratch copy of their seed corpus (tests/fuzz_corpus/).
#   bash tools/fuzz.sh TARGET SECONDS   TARGET: safetensors, checkpoint, vocab, corpus, or all (each in turn)
#   bash tools/fuzz.sh --build-only     just install clang and build build-fuzz/
# The first run installs clang 16, libFuzzer and llvm-symbolizer (Debian 12) where missing and configures
# build-fuzz/: clang++-16, -fsanitize=fuzzer,address,undefined, halting on the first report. (Debian's
# default clang 14 cannot compile miniflow: its std::source_location needs clang >= 15.) A crash, a
# sanitizer report, a hang (-timeout) or an allocation over -malloc_limit_mb stops the target and saves
# the input under build-fuzz/findings/TARGET/; the script then exits 1. Extra libFuzzer flags can go in
# FUZZ_FLAGS (e.g. FUZZ_FLAGS=-jobs=2).
set -euo pipefail
cd "$(dirname "$0")/.."

targets=(safetensors checkpoint vocab corpus)
usage() {
  local IFS='|'
  echo "usage: bash tools/fuzz.sh {${targets[*]}|all} SECONDS  |  bash tools/fuzz.sh --build-only" >&2
  exit 2
}
build_only=0
if [ $# -eq 1 ] && [ "$1" = --build-only ]; then
  build_only=1
elif [ $# -ne 2 ] || ! [[ $2 =~ ^[1-9][0-9]*$ ]]; then
  usage
elif [ "$1" = all ]; then
  chosen=("${targets[@]}")
elif [[ " ${targets[*]} " == *" $1 "* ]]; then
  chosen=("$1")
else
  usage
fi

packages=(clang-16 libclang-rt-16-dev llvm-16 meson ninja-build pkg-config libopenblas-dev libfmt-dev nlohmann-json3-dev)
bash tools/install_packages.sh "${packages[@]}"

if [ ! -f build-fuzz/build.ninja ]; then
  # Static libraries, so the one executable holds all the instrumented code; OSS-Fuzz's flags (-O1,
  # line tables only) keep the build short and stack traces readable.
  CXX=clang++-16 meson setup build-fuzz -Dfuzz=true -Dtests=false -Dtools=false -Dcuda=disabled \
    -Ddistributed=disabled -Ddefault_library=static -Doptimization=1 -Ddebug=false -Db_sanitize=address,undefined \
    -Dcpp_args="-fno-sanitize-recover=all -fno-omit-frame-pointer -gline-tables-only"
fi
ninja -C build-fuzz
((build_only)) && exit 0

export ASAN_OPTIONS=halt_on_error=1:detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export ASAN_SYMBOLIZER_PATH=/usr/lib/llvm-16/bin/llvm-symbolizer
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
status=0
for target in "${chosen[@]}"; do
  # libFuzzer adds the inputs it finds interesting to the corpus directory: a copy keeps tests/ as it is.
  cp -r "tests/fuzz_corpus/$target" "$scratch/$target"
  findings=build-fuzz/findings/$target
  mkdir -p "$findings"
  dict=()
  if [ -f "fuzz/$target.dict" ]; then dict=(-dict="fuzz/$target.dict"); fi
  echo "== fuzzing $target for $2 s"
  # shellcheck disable=SC2086  # FUZZ_FLAGS is a list of flags
  if ! "build-fuzz/fuzz/fuzz_$target" -max_total_time="$2" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
      -print_final_stats=1 -artifact_prefix="$findings/" "${dict[@]}" ${FUZZ_FLAGS:-} "$scratch/$target"; then
    echo "fuzz target $target failed: the input is saved in $findings/ (reproduce: build-fuzz/fuzz/fuzz_$target FILE)" >&2
    status=1
  fi
done
exit "$status"
