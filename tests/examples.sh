#!/usr/bin/env bash
# The programs under examples/ as a user builds them: miniflow installed (into a staging directory),
# each example compiled against the installed headers and library through pkg-config with
# -Wall -Wextra -Werror, then run for a few steps. Then the CPU library where no CUDA runtime is
# installed: it needs no CUDA library, and with the machine's CUDA libraries hidden a program runs on
# the CPU while asking a tool for --device cuda fails, saying why.
set -euo pipefail
source_root=$1 build_root=$2
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
meson install -C "$build_root" --destdir "$stage" --quiet >/dev/null
pc=$(find "$stage" -name miniflow.pc | head -n 1)
[ -n "$pc" ] || { echo "FAIL: the install holds no miniflow.pc"; exit 1; }
prefix=$(pkg-config --variable=prefix "$pc")
flags=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --define-variable=prefix="$stage$prefix" --cflags --libs miniflow)
libdir=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --define-variable=prefix="$stage$prefix" --variable=libdir miniflow)

# A sanitized library needs its runtime in the program too.
sanitize=$(meson introspect "$build_root" --buildoptions |
  python3 -c 'import json, sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == "b_sanitize"))')
[ "$sanitize" = none ] || flags="-fsanitize=$sanitize $flags"

cd "$stage"
# shellcheck disable=SC2086  # pkg-config's flags split into words on purpose
g++ -std=c++20 -O2 -Wall -Wextra -Werror "$source_root/examples/char_gpt.cpp" -o char_gpt $flags -Wl,-rpath,"$libdir"
lines=$(wc -l < "$source_root/examples/char_gpt.cpp")
[ "$lines" -le 120 ] || { echo "FAIL: examples/char_gpt.cpp has $lines lines, the guide promises 120 at most"; exit 1; }
./char_gpt --text "$source_root/examples/char_gpt.txt" --steps 3 > out.txt
cat out.txt
grep -q "^step 3  loss " out.txt || { echo "FAIL: char_gpt did not report step 3"; exit 1; }
[ -s char_gpt.safetensors ] || { echo "FAIL: char_gpt saved no checkpoint"; exit 1; }
[ "$(tail -n +2 out.txt | wc -c)" -ge 65 ] || { echo "FAIL: char_gpt sampled fewer than 64 characters"; exit 1; }
status=0
./char_gpt --steps three > /dev/null 2>&1 || status=$?
[ "$status" -eq 1 ] || { echo "FAIL: a malformed --steps exited $status, not 1 with a message"; exit 1; }
status=0
./char_gpt --no-such-flag > /dev/null 2>&1 || status=$?
[ "$status" -eq 2 ] || { echo "FAIL: an unknown flag exited $status, not 2"; exit 1; }
echo "ok: examples/char_gpt.cpp builds against the installed library without warnings and runs"

# shellcheck disable=SC2086
g++ -std=c++20 -O2 -Wall -Wextra -Werror "$source_root/examples/hello.cpp" -o hello $flags -Wl,-rpath,"$libdir"
cuda_libraries='lib(cuda|cudart|cublas|cublasLt|nccl)\.so'
if ldd "$libdir/libminiflow.so" | grep -E "$cuda_libraries"; then
  echo "FAIL: the installed libminiflow.so needs the CUDA libraries above"; exit 1
fi
# The dynamic loader, told to ignore its cache (which lists this machine's CUDA libraries, outside the
# system folders), finds only what the system folders, the staged libdir and the programs' own run
# paths hold.
loader=$(readelf -l hello | sed -n 's/.*interpreter: \(.*\)]/\1/p')
hidden() { "$loader" --inhibit-cache --library-path "$libdir" "$@"; }
peak_rss_mb() { python3 -c 'import resource, subprocess, sys
subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)' "$@"; }
backend=$libdir/libminiflow_cuda.so
backend_libraries=$([ -f "$backend" ] && hidden --list "$backend" 2>&1 || true)
if [ ! -f "$backend" ]; then
  echo "SKIPPED: a build without CUDA has no backend to hide"
elif ! grep -Eq "$cuda_libraries[.0-9]*(: cannot open| => not found)" <<< "$backend_libraries"; then
  echo "SKIPPED: this machine's CUDA libraries are in a system folder, where the loader cannot hide them"
else
  hidden ./hello > out.txt
  grep -q "1.5" out.txt || { echo "FAIL: hello printed no 1.5 (a row of three 1s times a column of 0.5s)"; cat out.txt; exit 1; }
  echo "ok: examples/hello.cpp runs with the CUDA libraries hidden, peak RSS $(peak_rss_mb "$loader" --inhibit-cache --library-path "$libdir" ./hello) MB"
  status=0
  hidden "$build_root/tools/train_transformer" --device cuda > /dev/null 2> err.txt || status=$?
  [ "$status" -eq 1 ] || { echo "FAIL: train_transformer --device cuda exited $status, not 1"; cat err.txt; exit 1; }
  grep -q "no CUDA device is available: the CUDA backend could not be loaded (libcu.*cannot open shared object" \
    err.txt || { echo "FAIL: train_transformer --device cuda did not say that the CUDA runtime is missing:"; cat err.txt; exit 1; }
  echo "ok: with the CUDA libraries hidden, train_transformer --device cuda says: $(cat err.txt)"
fi
