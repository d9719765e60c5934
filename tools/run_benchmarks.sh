#!/usr/bin/env bash
# Runs miniflow's bench_transformer and its PyTorch peer tools/bench_pytorch.py on the issue's
# configs, each config in its own process, and writes BENCHMARKS.md (tools/write_benchmarks.py).
# PyTorch comes from PyPI into .venv-bench (created on first use; the default wheel pulls the CUDA
# runtime packages too, about 5.4 GB). Benchmarks, not tests: CI does not run this.
#
#   bash tools/run_benchmarks.sh [--configs seed,small,base] [--steps N] [--output BENCHMARKS.md]
set -euo pipefail

cd "$(dirname "$0")/.."
configs="seed,small,base"
steps=10
output="BENCHMARKS.md"
command_line="bash tools/run_benchmarks.sh $*"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --configs) configs="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --output) output="$2"; shift 2 ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "run_benchmarks.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
IFS=',' read -ra config_list <<< "$configs"
for c in "${config_list[@]}"; do
  [[ "$c" == seed || "$c" == small || "$c" == base ]] || {
    echo "run_benchmarks.sh: unknown config '$c' (seed, small or base)" >&2; exit 2; }
done

venv=.venv-bench
if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  free_gb=$(df -Pk . | awk 'NR == 2 { print int($4 / 1048576) }')
  if (( free_gb < 8 )); then
    echo "run_benchmarks.sh: only ${free_gb} GB free; installing torch into $venv needs about 8" >&2; exit 1
  fi
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
  "$venv/bin/pip" install --quiet torch numpy  # numpy only silences torch's warning
fi

if [[ ! -d build ]]; then meson setup build; fi
ninja -C build tools/bench_transformer

results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT
loadavg_before=$(cut -d' ' -f1-3 /proc/loadavg)
for c in "${config_list[@]}"; do
  echo "== $c: miniflow (2 threads)" >&2
  build/tools/bench_transformer --config "$c" --threads 2 --steps "$steps" --json | tee -a "$results/miniflow.jsonl" >&2
  echo "== $c: PyTorch (1 and 2 threads)" >&2
  "$venv/bin/python" tools/bench_pytorch.py --config "$c" --steps "$steps" --json | tee -a "$results/pytorch.jsonl" >&2
done
loadavg_after=$(cut -d' ' -f1-3 /proc/loadavg)

rev=$(git rev-parse --short HEAD)
git diff --quiet HEAD -- . ':!BENCHMARKS.md' || rev="$rev (with uncommitted changes)"
compiler=$(c++ --version | head -1)  # meson's default C++ compiler, the one build/ was configured with
openblas=$(pkg-config --modversion openblas 2>/dev/null || echo unknown)
torch_info=$("$venv/bin/python" -c '
import re, sys, torch
blas = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
print(torch.__version__)
print(blas.group(1).upper() if blas else "unknown")
print(sys.version.split()[0])')
# The vector extensions miniflow's kernels and PyTorch's choose between.
simd_flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -xE 'avx2|fma|avx512f|avx512_bf16|avx512_vnni|amx_bf16' \
  | tr '\n' ' ' | sed 's/ $//')
# "CPU <model name (family, model)>: kernels ...", as the tools print it.
cpu_line=$(build/tools/bench_transformer --version | sed -n 's/^CPU //p')
python3 - "$results/meta.json" <<EOF
import json, sys
info = """$torch_info""".splitlines()
json.dump({"date": "$(date -u '+%Y-%m-%d %H:%M UTC')", "command": """$command_line""".strip(),
           "cpu": "${cpu_line%%: *}", "cores": "$(nproc)", "cpu_flags": "$simd_flags",
           "kernels": "${cpu_line#*: }",
           "loadavg_before": "$loadavg_before", "loadavg_after": "$loadavg_after", "git_rev": "$rev",
           "compiler": "$compiler", "openblas": "$openblas", "torch_version": info[0], "torch_blas": info[1].strip(),
           "python": info[2]}, open(sys.argv[1], "w"))
EOF
# Hand-written analysis (profiles, where the time goes) lives in tools/benchmark_notes.md, if present.
notes=()
if [[ -f tools/benchmark_notes.md ]]; then notes=(--notes tools/benchmark_notes.md); fi
python3 tools/write_benchmarks.py --miniflow "$results/miniflow.jsonl" --pytorch "$results/pytorch.jsonl" \
  --meta "$results/meta.json" "${notes[@]}" --output "$output"
echo "wrote $output" >&2
