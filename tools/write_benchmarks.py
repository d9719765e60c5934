#!/usr/bin/env python3
"""Writes BENCHMARKS.md from the JSON lines of tools/bench_transformer (miniflow) and
tools/bench_pytorch.py (PyTorch) and a JSON object describing the run (machine, versions, command).
Standard library only: tools/run_benchmarks.sh calls it with the system Python."""
import argparse
import json

# The targets, each against PyTorch measured in the same run.
STEP_RATIO_MAX = 0.7      # miniflow step time / PyTorch step time, every config
GEMM_SHARE_MIN = 0.75     # miniflow achieved GFLOP/s / cblas_sgemm rate, on small and base
GREEDY_RATIO_MIN = 5.0    # miniflow greedy tokens/s / PyTorch tutorial greedy tokens/s
BEAM_RATIO_MIN = 2.0      # miniflow beam-4 tokens/s / PyTorch tutorial greedy tokens/s
GEMM_CONFIGS = ("small", "base")


def read_lines(path):
    with open(path) as f:
        return {r["config"]: r for r in (json.loads(line) for line in f if line.strip())}


def training_table(mf, pt):
    rows = ["| config | run | threads | step ms | forward | backward | optimizer | tokens/s | GFLOP/s | "
            "% of GEMM rate | GEMM GFLOP/s | peak RSS MB |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def row(config, label, r):
        gemm = f"{r['sgemm_gflops']:.1f}"
        if "matmul_gflops" in r:  # miniflow's own GEMM beside the cblas_sgemm yardstick
            gemm += f" (own {r['matmul_gflops']:.1f})"
        rows.append(f"| {config} | {label} | {r['threads']} | {r['ms_per_step']:.1f} | {r['forward_ms']:.1f} | "
                    f"{r['backward_ms']:.1f} | {r['optimizer_ms']:.1f} | {r['tokens_per_s']:.0f} | {r['gflops']:.1f} | "
                    f"{100 * r['gflops_vs_sgemm']:.0f}% | {gemm} | {r['peak_rss_mb']:.0f} |")

    for config in mf:
        row(config, "**miniflow**", mf[config])
        if config not in pt:
            continue
        for threads, r in sorted(pt[config].get("by_threads", {}).items()):
            best = " (best)" if int(threads) == pt[config]["threads"] else ""
            row(config, f"PyTorch{best}", r)
        if "by_threads" not in pt[config]:
            row(config, "PyTorch", pt[config])
    return "\n".join(rows)


def decoding_table(mf, pt):
    m, p = mf.get("small", {}), pt.get("small", {})
    if "greedy_tokens_per_s" not in m or "greedy_tokens_per_s" not in p:
        return "Decoding was not measured (it runs with the small config)."
    base = p["greedy_tokens_per_s"]
    rows = ["| decoder (small config, 32 sentences, up to 32 new tokens) | threads | tokens/s | vs PyTorch greedy |",
            "|---|---|---|---|",
            f"| **miniflow** greedy (key/value cache, batched) | {m['threads']} | {m['greedy_tokens_per_s']:.0f} | "
            f"{m['greedy_tokens_per_s'] / base:.2f}x |",
            f"| **miniflow** beam 4 (key/value cache, batched) | {m['threads']} | {m['beam4_tokens_per_s']:.0f} | "
            f"{m['beam4_tokens_per_s'] / base:.2f}x |"]
    for threads, r in sorted(p.get("by_threads", {}).items()):
        best = ", best" if int(threads) == p.get("decode_threads") else ""
        rows.append(f"| PyTorch tutorial greedy (whole prefix re-run{best}) | {threads} | "
                    f"{r['greedy_tokens_per_s']:.0f} | {r['greedy_tokens_per_s'] / base:.2f}x |")
    return "\n".join(rows)


def verdict(ok):
    return "PASS" if ok else "**MISS**"


def targets(mf, pt):
    """Rows of the targets table, and for each miss a sentence saying by how much and where the time goes."""
    rows, misses = [], []
    for config, m in mf.items():
        if config not in pt:
            continue
        p = pt[config]
        ratio = m["ms_per_step"] / p["ms_per_step"]
        allowed = STEP_RATIO_MAX * p["ms_per_step"]
        rows.append((f"step time <= {STEP_RATIO_MAX}x PyTorch", config, f"{ratio:.2f}x ({m['ms_per_step']:.1f} vs "
                     f"{p['ms_per_step']:.1f} ms)", verdict(ratio <= STEP_RATIO_MAX),
                     f"{allowed - m['ms_per_step']:+.1f} ms ({(allowed - m['ms_per_step']) / allowed:+.0%})"))
        if ratio > STEP_RATIO_MAX:
            excess = {phase: m[f"{phase}_ms"] - STEP_RATIO_MAX * p[f"{phase}_ms"]
                      for phase in ("forward", "backward", "optimizer")}
            parts = ", ".join(f"{phase} {m[f'{phase}_ms']:.1f} ms vs PyTorch {p[f'{phase}_ms']:.1f} ms "
                              f"({m[f'{phase}_ms'] / p[f'{phase}_ms']:.2f}x, {excess[phase]:+.1f} ms over "
                              f"{STEP_RATIO_MAX}x)" for phase in excess)
            misses.append(f"- **{config} step time**: {m['ms_per_step'] - allowed:.1f} ms too slow "
                          f"({m['ms_per_step']:.1f} ms against the {allowed:.1f} ms allowed). By phase: {parts}.")
        rss_ok = m["peak_rss_mb"] <= p["peak_rss_mb"]
        rows.append(("peak RSS <= PyTorch", config, f"{m['peak_rss_mb']:.0f} vs {p['peak_rss_mb']:.0f} MB "
                     f"({m['peak_rss_mb'] / p['peak_rss_mb']:.2f}x)", verdict(rss_ok),
                     f"{p['peak_rss_mb'] - m['peak_rss_mb']:+.0f} MB"))
        if not rss_ok:
            misses.append(f"- **{config} peak RSS**: {m['peak_rss_mb'] - p['peak_rss_mb']:.0f} MB above PyTorch's.")
    for config in GEMM_CONFIGS:
        if config not in mf:
            continue
        share = mf[config]["gflops_vs_sgemm"]
        measured = f"{share:.0%} ({mf[config]['gflops']:.1f} of {mf[config]['sgemm_gflops']:.1f})"
        if "gflops_vs_matmul" in mf[config]:
            measured += (f"; {mf[config]['gflops_vs_matmul']:.0%} of miniflow's own GEMM "
                         f"({mf[config]['matmul_gflops']:.1f})")
        rows.append((f"GFLOP/s >= {GEMM_SHARE_MIN:.0%} of cblas_sgemm", config, measured,
                     verdict(share >= GEMM_SHARE_MIN), f"{100 * (share - GEMM_SHARE_MIN):+.0f} points"))
        if share < GEMM_SHARE_MIN:
            step = mf[config]["ms_per_step"]
            misses.append(f"- **{config} GFLOP/s**: {share:.0%} of the GEMM rate, {100 * (GEMM_SHARE_MIN - share):.0f} "
                          f"points short: at the measured sgemm rate the step's FLOPs take {step * share:.0f} ms of its "
                          f"{step:.0f} ms; {GEMM_SHARE_MIN:.0%} needs a step of {step * share / GEMM_SHARE_MIN:.0f} ms "
                          f"(the forward / backward / optimizer split is in the training table).")
    m, p = mf.get("small", {}), pt.get("small", {})
    if "greedy_tokens_per_s" in m and "greedy_tokens_per_s" in p:
        base = p["greedy_tokens_per_s"]
        for label, key, need in (("greedy", "greedy_tokens_per_s", GREEDY_RATIO_MIN),
                                 ("beam 4", "beam4_tokens_per_s", BEAM_RATIO_MIN)):
            ratio = m[key] / base
            rows.append((f"{label} >= {need:g}x PyTorch greedy", "small", f"{ratio:.2f}x ({m[key]:.0f} vs "
                         f"{base:.0f} tok/s)", verdict(ratio >= need), f"{ratio / need - 1:+.0%}"))
            if ratio < need:
                misses.append(f"- **{label} decoding**: {ratio:.2f}x, needs {need:g}x ({need * base:.0f} tok/s, "
                              f"{need * base - m[key]:.0f} tok/s short).")
    table = ["| target | config | measured | result | margin |", "|---|---|---|---|---|"]
    table += [f"| {' | '.join(r)} |" for r in rows]
    return "\n".join(table), misses


def document(mf, pt, meta, raw, notes):
    cores = int(meta.get("cores", 0)) or 1
    # The load after the run counts the benchmark's own threads: only the load before it tells of other jobs.
    loaded = float(meta.get("loadavg_before", "0").split()[0]) > 0.5 * cores
    table, misses = targets(mf, pt)
    import_rss = next((f"{r['import_rss_mb']:.0f} MB" for r in pt.values() if "import_rss_mb" in r), "not measured")
    out = [
        "# Benchmarks",
        "",
        "miniflow's `tools/bench_transformer` against its PyTorch peer `tools/bench_pytorch.py` (the same model and "
        "training step, written the plain PyTorch way), measured in one run. Generated by `tools/write_benchmarks.py`; "
        "regenerate with the command below rather than editing by hand.",
        "",
        f"- Date: {meta.get('date', '?')}",
        f"- Command: `{meta.get('command', '?')}`",
        f"- Machine: {meta.get('cpu', '?')} (flags: {meta.get('cpu_flags', '?')}), {cores} cores; miniflow's "
        f"{meta.get('kernels', 'kernels ?')}; load average (1, 5, 15 min) before "
        f"`{meta.get('loadavg_before', '?')}`, after `{meta.get('loadavg_after', '?')}` (the benchmark's own threads "
        "included)",
        f"- miniflow: git `{meta.get('git_rev', '?')}`, {meta.get('compiler', '?')}, OpenBLAS "
        f"{meta.get('openblas', '?')}, `--threads {mf[next(iter(mf))]['threads'] if mf else '?'}`",
        f"- PyTorch: {meta.get('torch_version', '?')} from PyPI (Python {meta.get('python', '?')}), "
        f"OMP_WAIT_POLICY=PASSIVE, the faster of 1 and 2 intra-op threads per config; its GEMM: "
        f"{meta.get('torch_blas', '?')}",
        "",
    ]
    if loaded:
        out += ["> **This machine was loaded when the run began** (1-minute load average above half the core count: "
                "other jobs, such as parallel builds, shared the cores), so every figure is pessimistic and noisy, the "
                "ratios less so than the absolute times. A run on an idle machine should replace this file.", ""]
    out += [
        "## Training step",
        "",
        "Median over the timed steps after 2 warm-up steps of forward + loss, backward, and Adam step + zero_grad. "
        "tokens/s counts source + target tokens. GFLOP/s = 3 x the forward FLOPs (every Linear, the attention "
        "products, the tied output projection) / step time; the % column divides it by the rate of a 2048^3 float32 "
        "GEMM timed in the same process after every timed step (the median), so that both are measured under the same "
        "conditions: for miniflow, OpenBLAS's cblas_sgemm (the issue's yardstick), its rows split over the threads as "
        "miniflow splits a product, with miniflow's own GEMM on the same product in brackets (miniflow trains on its "
        "own GEMM; the two are timed after alternate steps); torch.matmul for PyTorch. Either side holds the "
        "yardstick's two operands and one output (48 MB) in its peak RSS. "
        "Each config ran in its own process (each PyTorch thread count too), so peak RSS is per config; "
        f"PyTorch's includes the torch library itself ({import_rss} after `import torch` alone, before any "
        "tensor exists).",
        "",
        training_table(mf, pt),
        "",
        "## Decoding",
        "",
        "Random source ids (untrained model, so most sentences run the full 32 tokens); a sentence's tokens are "
        "counted up to and including its EOS; the time includes encoding the sources. miniflow's decoders use the "
        "key/value cache and drop finished rows; PyTorch's is the classic tutorial loop, re-running the decoder over "
        "the whole prefix for every token.",
        "",
        decoding_table(mf, pt),
        "",
        "## Targets",
        "",
        table,
        "",
    ]
    if misses:
        out += ["### Missed targets: by how much, and where the time goes", ""] + misses + [""]
    if notes:
        out += ["## Analysis", "", notes.strip(), ""]
    out += ["## Raw results", "", "```", *raw, "```", ""]
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--miniflow", required=True, help="JSON lines of bench_transformer --json")
    parser.add_argument("--pytorch", required=True, help="JSON lines of bench_pytorch.py --json")
    parser.add_argument("--meta", required=True, help="JSON object: date, command, cpu, cores, loadavg_before, "
                        "loadavg_after, git_rev, compiler, openblas, torch_version, torch_blas, python")
    parser.add_argument("--notes", help="Markdown written by hand (profiles, explanations), kept as the Analysis "
                        "section so that regenerating the file does not lose it")
    parser.add_argument("--output", default="BENCHMARKS.md")
    args = parser.parse_args()
    with open(args.meta) as f:
        meta = json.load(f)
    raw = []
    for label, path in (("miniflow", args.miniflow), ("pytorch", args.pytorch)):
        with open(path) as f:
            raw += [f"{label}: {line.strip()}" for line in f if line.strip()]
    notes = ""
    if args.notes:
        with open(args.notes) as f:
            notes = f.read()
    text = document(read_lines(args.miniflow), read_lines(args.pytorch), meta, raw, notes)
    with open(args.output, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
