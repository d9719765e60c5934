#!/usr/bin/env bash
# Leak check under valgrind memcheck, on the release build (the sanitizer build's suite already runs the
# same toy training under LeakSanitizer): train_transformer trains 10 steps on the built-in toy corpus
# and saves a checkpoint, then resumes from it for 5 more, each run ending with the toy translations
# (greedy and beam search). Any definite or indirect leak, or any memory error (invalid read or write,
# use of uninitialised memory, bad free), fails. Blocks still reachable at exit (the caching
# allocator's pool, OpenBLAS's and CUDA's buffers) are not leaks. So few steps leave the toy corpus
# unlearned, so the tool's own exit status 1 ("not learned") is expected; valgrind reports with 99.
#   usage: bash .ci/leak_check.sh [build-dir]      (default build/; installs valgrind when missing)
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}

bash tools/install_packages.sh valgrind || exit 1

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# One thread each for the pool and OpenBLAS: valgrind runs one thread at a time anyway.
export OPENBLAS_NUM_THREADS=1
memcheck=(valgrind --quiet --suppressions=.ci/valgrind.supp --leak-check=full
          --errors-for-leak-kinds=definite,indirect --error-exitcode=99)
status=0
start=$SECONDS
run() {  # name, train_transformer flags...
  local name=$1; shift
  "${memcheck[@]}" "$build/tools/train_transformer" --threads 1 --checkpoint "$dir/leak.safetensors" "$@" \
    >"$dir/$name.log" 2>&1
  local rc=$?
  if [ "$rc" -eq 99 ] || [ "$rc" -gt 1 ] || ! grep -q '^[0-9]/8 correct$' "$dir/$name.log"; then
    cat "$dir/$name.log"
    echo "leak check: $name run FAILED (exit status $rc; valgrind's report, if any, is above)"
    status=1
  fi
}
run first --max-steps 10
run resumed --max-steps 5 --resume
if [ "$status" -eq 0 ]; then echo "leak check: no leaks, no memory errors ($((SECONDS - start)) s)"; fi
exit "$status"
