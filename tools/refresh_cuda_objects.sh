#!/usr/bin/env bash
# Usage: bash tools/refresh_cuda_objects.sh BUILD_DIR
#
# Meson before 1.4 gives nvcc no dependency-file flags (mesonbuild/meson#11969, fixed in 1.4 by
# #12665), so ninja never learns which headers a .cu file includes: after a header changes, an
# incremental build would link the old CUDA objects beside new C++ ones that disagree with them
# about struct layouts and signatures. This removes every CUDA object older than the newest header
# of the library (tests/ and tools/ hold none a .cu file includes), so that the next ninja compiles
# those again. With meson 1.4 or later, or a build without CUDA objects, it does nothing.
set -euo pipefail

build=${1:?usage: bash tools/refresh_cuda_objects.sh BUILD_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)

version=$(meson --version)
if printf '%s\n' 1.4 "$version" | sort -V -C; then exit 0; fi  # 1.4 <= version: depfiles work

[ -d "$build" ] || exit 0
skipped=(-path "$root/build*" -o -path "$root/.*" -o -path "$root/tests" -o -path "$root/tools")
headers=(-name '*.h' -o -name '*.cuh' -o -name '*.inc')
newest_header=$(find "$root" \( "${skipped[@]}" \) -prune -o \( "${headers[@]}" \) -printf '%T@ %p\n' |
                sort -n | tail -1 | cut -d' ' -f2-)
[ -n "$newest_header" ] || exit 0
stale=$(find "$build" -name '*.cu.o' ! -newer "$newest_header")
[ -n "$stale" ] || exit 0
echo "meson $version does not track the headers of CUDA sources: recompiling $(echo "$stale" | wc -l)" \
     "CUDA objects older than $newest_header"
echo "$stale" | xargs rm -f
