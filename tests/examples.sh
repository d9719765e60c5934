#!/usr/bin/env bash
# The programs under examples/ as a user builds them: miniflow installed (into a staging directory),
# each example compiled against the installed headers and library through pkg-config with
# -Wall -Wextra -Werror, then run for a few steps.
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
