#!/usr/bin/env bash
# Debian's oneDNN against miniflow's bfloat16 GEMM in one run (issue 19: "if oneDNN does it better,
# measure it against your kernel and choose with numbers"): build/tools/bench_gemm
# --float32-matmul-precision medium on 2048^3 and small's training products, then oneDNN's bfloat16
# matmul on the same products (tools/bench_onednn.cpp, built here against libdnnl-dev, which this
# script apt-installs when missing). One thread each. Benchmarks, not tests: CI does not run this.
# With --int8: build/tools/bench_gemm --int8 (miniflow's int8 linear on the decoding products), then
# oneDNN's int8 matmul on the same products (a hand-written kernel stays only where it wins).
#
#   bash tools/bench_onednn.sh [--reps N] [--int8]
set -euo pipefail
cd "$(dirname "$0")/.."
reps=7
int8=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --reps) reps="$2"; shift 2 ;;
    --int8) int8=1; shift ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "bench_onednn.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -x build/tools/bench_gemm ]] || { echo "bench_onednn.sh: build/tools/bench_gemm is missing; build first (bash tools/setup.sh)" >&2; exit 1; }
if [[ ! -f /usr/include/oneapi/dnnl/dnnl.hpp ]]; then
  apt-get install -y -q libdnnl-dev >/dev/null || { echo "bench_onednn.sh: cannot install libdnnl-dev" >&2; exit 1; }
fi
binary=build/tools/bench_onednn
c++ -std=c++20 -O2 -o "$binary" tools/bench_onednn.cpp -ldnnl
if [[ $int8 == 1 ]]; then
  build/tools/bench_gemm --int8 --threads 1 --reps "$reps"
  OMP_NUM_THREADS=1 "$binary" "$reps" int8
  exit 0
fi
for shapes in square small; do
  build/tools/bench_gemm --float32-matmul-precision medium --threads 1 --reps "$reps" --shapes "$shapes"
done
OMP_NUM_THREADS=1 "$binary" "$reps"
