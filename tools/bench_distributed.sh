#!/usr/bin/env bash
# Data-parallel scaling on this machine, ratios measured in one run: training tokens/s of each config
# at W=1 x 1 thread, W=1 x 2 threads and W=2 x 1 thread (mpirun -np 2), the rounds alternating so that
# drifts in the machine's speed fall on all three alike; the scaling efficiency
# E(2) = tok/s(W=2) / (2 x tok/s(W=1, 1 thread)); what the gradient reduction adds to a W=2 step,
# reduced during backward and after it, and the share of it hidden behind backward; and an all_reduce
# bandwidth sweep over 2 ranks. Prints a Markdown section for BENCHMARKS.md. Benchmarks, not tests:
# CI does not run this.
#
#   bash tools/bench_distributed.sh [--configs small,base] [--steps N] [--rounds N]
set -euo pipefail
cd "$(dirname "$0")/.."
configs="small,base"
steps=6
rounds=2
while [[ $# -gt 0 ]]; do
  case "$1" in
    --configs) configs="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "bench_distributed.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
bench=build/tools/bench_distributed
[[ -x "$bench" ]] || { echo "bench_distributed.sh: $bench is missing; build first (bash tools/setup.sh)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
results=$(mktemp)
trap 'rm -f "$results"' EXIT

IFS=',' read -ra config_list <<< "$configs"
for config in "${config_list[@]}"; do
  for round in $(seq 1 "$rounds"); do
    echo "$config, round $round/$rounds" >&2
    "$bench" --config "$config" --steps "$steps" --threads 1 --json >>"$results"
    "$bench" --config "$config" --steps "$steps" --threads 2 --json >>"$results"
    mpirun -np 2 --bind-to core "$bench" --distributed --config "$config" --steps "$steps" --threads 1 --json >>"$results"
  done
done
echo "all_reduce sweep" >&2
mpirun -np 2 --bind-to core "$bench" --distributed --sweep --json >>"$results"

python3 - "$results" "$("$bench" --version | tr '\n' ' ')" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
print(f"## Data-parallel training (bash tools/bench_distributed.sh)\n\n{sys.argv[2].strip()}\n")
print("| config | W=1 x 1 thread | W=1 x 2 threads | W=2 x 1 thread | E(2) | W=2x1 / W=1x2 | reduction alone "
      "| step longer: reduced during backward | reduced after it | reduction hidden |")
print("|---|---|---|---|---|---|---|---|---|---|")
for config in dict.fromkeys(r["config"] for r in rows if "config" in r):
    def runs(world, threads):
        return [r for r in rows if r.get("config") == config and r["world_size"] == world and r["threads"] == threads]
    tok = {k: statistics.median(r["tokens_per_s"] for r in runs(*k)) for k in [(1, 1), (1, 2), (2, 1)]}
    def at_w2(key):
        return statistics.median(r[key] for r in runs(2, 1))
    print(f"| {config} | {tok[1, 1]:.0f} tok/s | {tok[1, 2]:.0f} tok/s | {tok[2, 1]:.0f} tok/s | "
          f"{tok[2, 1] / (2 * tok[1, 1]):.3f} | {tok[2, 1] / tok[1, 2]:.3f} | {at_w2('reduction_ms'):.1f} ms | "
          f"{at_w2('exposed_ms'):.1f} ms | {at_w2('exposed_other_way_ms'):.1f} ms | {100 * at_w2('hidden'):.0f}% |")
print("\n\"Step longer\": each W=2 step's time less that of its twin without communication (the same ranks, each "
      "reducing over a group of its own), the three kinds taking turns in one run; the median over a run's steps, then "
      "over the rounds. \"Reduction hidden\": 1 - (step longer, reduced during backward) / (reduction alone).")
print("\nall_reduce (sum, float32) over 2 ranks; bus bandwidth = algorithm bandwidth x 2(W-1)/W, as nccl-tests:\n")
print("| bytes | time | algbw | busbw |\n|---|---|---|---|")
for r in rows:
    if "bytes" in r:
        print(f"| {r['bytes']} | {r['us']:.0f} us | {r['algbw']:.2f} GB/s | {r['busbw']:.2f} GB/s |")
PY
