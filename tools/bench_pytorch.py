#!/usr/bin/env python3
"""PyTorch peer of tools/bench_transformer.cpp: the same Transformer, the same training step and the
same measurements, written the plain way a PyTorch user would (nn.Linear, nn.LayerNorm, nn.Embedding,
explicit masked-softmax attention, nn.CrossEntropyLoss, torch.optim.Adam), printing the same JSON keys.

Decoding is the classic tutorials' batched greedy loop: no key/value cache, the whole decoder re-runs
over the prefix for every new token.

Without --threads, every config runs in its own child process once per intra-op thread count (1 and
2) with OMP_WAIT_POLICY=PASSIVE, and the fastest training step wins (the fastest greedy decode for the
decoding figure); each child's peak RSS is therefore that config's alone. The RSS of a PyTorch
process includes the torch library itself (a few hundred MB before any tensor exists).

Axes: B = batch, S = source length, T = target length, C = d_model, H = heads, D = C / H, V = vocab.
"""
import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time

# Threads that spin after a parallel region steal the only other core from the next one on a 2-core
# machine; PASSIVE makes OpenMP's workers sleep. It has to be set before torch (and its OpenMP) loads.
if os.environ.get("OMP_WAIT_POLICY") != "PASSIVE":
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

IMPORT_RSS_MB = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # the torch library alone

# name: (d_model, layers per stack, heads, d_ff, vocab, batch, length), as kConfigs in bench_transformer.cpp.
CONFIGS = {
    "seed": (512, 6, 8, 2048, 32, 6, 20),
    "small": (256, 3, 4, 1024, 8000, 32, 32),
    "base": (512, 6, 8, 2048, 16000, 16, 64),
}
PAD, BOS, EOS = 0, 1, 2  # miniflow's Vocab ids
MASK_VALUE = -1e9         # miniflow's kMaskValue: additive masks, 0 = attend
THREAD_CHOICES = (1, 2)


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, heads, dropout):
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, query, key, value, mask):
        B, T, C = query.shape
        S, H = key.shape[1], self.heads
        D = C // H
        q = self.q_proj(query).view(B, T, H, D).transpose(1, 2)   # [B, H, T, D]
        k = self.k_proj(key).view(B, S, H, D).transpose(1, 2)     # [B, H, S, D]
        v = self.v_proj(value).view(B, S, H, D).transpose(1, 2)   # [B, H, S, D]
        scores = q @ k.transpose(-2, -1) / math.sqrt(D)           # [B, H, T, S]
        probs = torch.softmax(scores + mask, dim=-1)
        context = self.dropout(probs) @ v                         # [B, H, T, D]
        return self.out_proj(context.transpose(1, 2).reshape(B, T, C))


class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.linear2(self.dropout(torch.relu(self.linear1(x))))


class EncoderLayer(nn.Module):
    """Post-norm: x = LayerNorm(x + dropout(sublayer(x)))."""

    def __init__(self, d_model, heads, d_ff, dropout):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, heads, dropout)
        self.ffn = FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, mask):
        x = self.norm1(x + self.dropout(self.self_attn(x, x, x, mask)))
        return self.norm2(x + self.dropout(self.ffn(x)))


class DecoderLayer(nn.Module):
    def __init__(self, d_model, heads, d_ff, dropout):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, heads, dropout)
        self.cross_attn = MultiHeadAttention(d_model, heads, dropout)
        self.ffn = FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, y, memory, self_mask, cross_mask):
        y = self.norm1(y + self.dropout(self.self_attn(y, y, y, self_mask)))
        y = self.norm2(y + self.dropout(self.cross_attn(y, memory, memory, cross_mask)))
        return self.norm3(y + self.dropout(self.ffn(y)))


class Transformer(nn.Module):
    """One embedding for source, target and the (tied, bias-free) output projection; embeddings
    scaled by sqrt(C) plus the sinusoidal positional encoding, then dropout."""

    def __init__(self, vocab, d_model, layers, heads, d_ff, dropout, max_len):
        super().__init__()
        self.d_model = d_model
        self.embed = nn.Embedding(vocab, d_model)
        # N(0, C^-1/2), as miniflow and the reference implementations: embed * sqrt(C) has unit scale.
        nn.init.normal_(self.embed.weight, std=d_model ** -0.5)
        position = torch.arange(max_len).unsqueeze(1)
        inv_freq = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2] = torch.sin(position * inv_freq)
        pe[:, 1::2] = torch.cos(position * inv_freq)
        self.register_buffer("pe", pe)                            # [max_len, C]
        self.dropout = nn.Dropout(dropout)
        self.encoder = nn.ModuleList(EncoderLayer(d_model, heads, d_ff, dropout) for _ in range(layers))
        self.decoder = nn.ModuleList(DecoderLayer(d_model, heads, d_ff, dropout) for _ in range(layers))

    def embed_tokens(self, tokens):
        x = self.embed(tokens) * math.sqrt(self.d_model)          # [B, L, C]
        return self.dropout(x + self.pe[: tokens.shape[1]])

    def encode(self, src):
        mask = padding_mask(src)
        x = self.embed_tokens(src)
        for layer in self.encoder:
            x = layer(x, mask)
        return x                                                  # [B, S, C]

    def decode(self, tgt_in, memory, src):
        T = tgt_in.shape[1]
        causal = torch.triu(torch.full((T, T), MASK_VALUE, device=tgt_in.device), diagonal=1)  # [T, T]
        self_mask = causal + padding_mask(tgt_in)                 # [B, 1, T, T]
        cross_mask = padding_mask(src)                            # [B, 1, 1, S]
        y = self.embed_tokens(tgt_in)
        for layer in self.decoder:
            y = layer(y, memory, self_mask, cross_mask)
        return y @ self.embed.weight.t()                          # [B, T, V]

    def forward(self, src, tgt_in):
        return self.decode(tgt_in, self.encode(src), src)


def padding_mask(tokens):
    """tokens [B, L] -> additive mask [B, 1, 1, L] hiding PAD keys."""
    return torch.zeros(tokens.shape, device=tokens.device).masked_fill(tokens == PAD, MASK_VALUE)[:, None, None, :]


def forward_flops(d_model, layers, d_ff, vocab, batch, length):
    """FLOPs of one forward pass, the formula of forward_flops() in tools/bench_transformer.cpp:
    2 x multiply-adds of every Linear, the attention products Q K^T and P V, and the tied output
    projection. A training step counts 3x (backward = twice the forward)."""
    B, L, C, F, V, N = batch, length, d_model, d_ff, vocab, layers
    tokens = B * L
    attention_products = 2 * B * L * L * C
    encoder_layer = tokens * (4 * C * C + 2 * C * F) + attention_products
    decoder_layer = tokens * (8 * C * C + 2 * C * F) + 2 * attention_products
    return 2 * (N * (encoder_layer + decoder_layer) + tokens * C * V)


def synchronize(device):
    """Waits for the work queued on `device` (CUDA kernels run asynchronously), as miniflow's bench does."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds_since(start, device):
    synchronize(device)
    return time.perf_counter() - start


class GemmYardstick:
    """Float32 2048^3 torch.matmul (torch's own GEMM: MKL/oneDNN in the x86 wheels, cuBLAS on a GPU),
    one product timed after every timed training step, as miniflow's bench does: the rate is measured
    under the conditions the steps ran in."""

    SIZE = 2048

    def __init__(self, device):
        self.device = device
        self.a = torch.randn(self.SIZE, self.SIZE, device=device)
        self.b = torch.randn(self.SIZE, self.SIZE, device=device)
        torch.matmul(self.a, self.b)  # warm-up
        synchronize(device)
        self.seconds = []

    def sample(self):
        start = time.perf_counter()
        torch.matmul(self.a, self.b)
        self.seconds.append(seconds_since(start, self.device))

    def gflops(self):
        return 2.0 * self.SIZE ** 3 / statistics.median(self.seconds) / 1e9


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports kilobytes


def tutorial_greedy(model, src, max_new_tokens):
    """Batched greedy decoding as the classic tutorials write it: every step runs the decoder over
    the whole prefix [B, t] and keeps the last position's argmax; rows after EOS get PAD.
    Returns [B, 1 + generated]: BOS, then the tokens."""
    memory = model.encode(src)
    ys = torch.full((src.shape[0], 1), BOS, dtype=torch.long, device=src.device)  # [B, 1]
    finished = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
    for _ in range(max_new_tokens):
        logits = model.decode(ys, memory, src)[:, -1]             # [B, V]
        next_tokens = logits.argmax(-1).masked_fill(finished, PAD)
        ys = torch.cat([ys, next_tokens[:, None]], dim=1)
        finished |= next_tokens == EOS
        if finished.all():
            break
    return ys


def generated_tokens(ys):
    """Tokens after BOS up to and including each row's EOS, as miniflow's bench counts them."""
    return sum((row == EOS).nonzero()[0].item() + 1 if (row == EOS).any() else len(row) for row in ys[:, 1:])


def bench_config(name, steps, decode, device, precision):
    d_model, layers, heads, d_ff, vocab, batch, length = CONFIGS[name]
    torch.manual_seed(0)
    model = Transformer(vocab, d_model, layers, heads, d_ff, dropout=0.1, max_len=max(length, 64) + 1).to(device)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    criterion = nn.CrossEntropyLoss(ignore_index=PAD)
    # Random ids in [1, V): no padding, so every position does full work.
    src = torch.randint(1, vocab, (batch, length)).to(device)
    tgt_in = torch.randint(1, vocab, (batch, length)).to(device)
    tgt_out = torch.randint(1, vocab, (batch, length)).to(device)

    yardstick = GemmYardstick(device)
    # bf16: forward and loss under autocast, backward and the optimizer outside it, as PyTorch's AMP
    # recipe has it (bfloat16 needs no GradScaler).
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
    phases = {"forward": [], "backward": [], "optimizer": [], "total": []}
    for step in range(steps + 2):  # two warm-up steps, as the C++ bench
        start = time.perf_counter()
        with autocast:
            loss = criterion(model(src, tgt_in).reshape(-1, vocab), tgt_out.reshape(-1))
        forward = seconds_since(start, device)
        start = time.perf_counter()
        loss.backward()
        backward = seconds_since(start, device)
        start = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad()
        opt = seconds_since(start, device)
        if step >= 2:
            for key, value in zip(phases, (forward, backward, opt, forward + backward + opt)):
                phases[key].append(value)
            yardstick.sample()
    step_s = statistics.median(phases["total"])
    gflops = 3 * forward_flops(d_model, layers, d_ff, vocab, batch, length) / step_s / 1e9
    out = {
        "ms_per_step": step_s * 1e3,
        "forward_ms": statistics.median(phases["forward"]) * 1e3,
        "backward_ms": statistics.median(phases["backward"]) * 1e3,
        "optimizer_ms": statistics.median(phases["optimizer"]) * 1e3,
        "tokens_per_s": 2 * batch * length / step_s,  # source + target tokens
        "gflops": gflops,
        "sgemm_gflops": yardstick.gflops(),
        "gflops_vs_sgemm": gflops / yardstick.gflops(),
        "peak_rss_mb": peak_rss_mb(),
    }
    if device.type == "cuda":
        out["peak_device_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    if decode:
        model.eval()
        sources = torch.randint(3, vocab, (32, length)).to(device)
        with torch.no_grad(), autocast:
            start = time.perf_counter()
            ys = tutorial_greedy(model, sources, max_new_tokens=32)
            elapsed = seconds_since(start, device)
        out["greedy_tokens_per_s"] = generated_tokens(ys) / elapsed
        out["peak_rss_mb"] = peak_rss_mb()
    return out


def run_here(names, threads, steps, device, precision):
    """Benchmarks `names` in this process at `threads` intra-op threads; yields JSON-ready dicts."""
    torch.set_num_threads(threads)
    for name in names:
        result = {"config": name, "device": str(device), "threads": threads, "torch_version": torch.__version__,
                  "import_rss_mb": IMPORT_RSS_MB, "precision": precision}
        if device.type == "cuda":
            result["gpu"] = torch.cuda.get_device_name(device)
        result.update(bench_config(name, steps, decode=name == "small", device=device, precision=precision))
        yield result


def run_children(names, steps, precision):
    """Each config in its own process per thread count; keeps the fastest training step (and the
    fastest greedy decode), and records every thread count's figures under by_threads."""
    for name in names:
        tried = {}
        for threads in THREAD_CHOICES:
            command = [sys.executable, __file__, "--config", name, "--threads", str(threads),
                       "--steps", str(steps), "--precision", precision, "--json"]
            line = subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip()
            tried[threads] = json.loads(line.splitlines()[-1])
        best = min(tried.values(), key=lambda r: r["ms_per_step"])
        result = dict(best)
        if "greedy_tokens_per_s" in best:
            fastest = max(tried.values(), key=lambda r: r["greedy_tokens_per_s"])
            result["greedy_tokens_per_s"] = fastest["greedy_tokens_per_s"]
            result["decode_threads"] = fastest["threads"]
        result["by_threads"] = {str(t): {k: v for k, v in r.items() if k not in ("config", "torch_version")}
                                for t, r in tried.items()}
        yield result


def print_result(result, as_json):
    if as_json:
        print(json.dumps(result), flush=True)
        return
    r = result
    print(f"{r['config']:>5}: {r['ms_per_step']:8.1f} ms/step (fwd {r['forward_ms']:.1f}, bwd {r['backward_ms']:.1f}, "
          f"adam {r['optimizer_ms']:.1f})  {r['tokens_per_s']:8.0f} tok/s  {r['gflops']:6.1f} GFLOP/s "
          f"({100 * r['gflops_vs_sgemm']:.0f}% of torch GEMM {r['sgemm_gflops']:.1f})  peak RSS "
          f"{r['peak_rss_mb']:.0f} MB  threads {r['threads']}", flush=True)
    if "greedy_tokens_per_s" in r:
        print(f"       tutorial greedy decoding, 32 sentences: {r['greedy_tokens_per_s']:.0f} tok/s", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), help="run only this config")
    parser.add_argument("--threads", type=int,
                        help="intra-op threads; without it, 1 and 2 are tried per config and the fastest kept")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per config, after 2 warm-up steps")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                        help="bf16: forward and loss under torch.autocast(dtype=torch.bfloat16)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per config")
    parser.add_argument("--device", default="cpu",
                        help="cpu, cuda or cuda:N (on a GPU the configs run in this process, at the default threads)")
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be at least 1")
    try:
        device = torch.device(args.device)
    except RuntimeError:
        parser.error(f"unknown device '{args.device}' (cpu, cuda or cuda:N)")
    if device.type not in ("cpu", "cuda"):
        parser.error(f"unknown device '{args.device}' (cpu, cuda or cuda:N)")
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"bench_pytorch.py: --device {args.device}: torch.cuda.is_available() is false")
    names = [args.config] if args.config else list(CONFIGS)
    if device.type == "cuda":
        results = run_here(names, args.threads or torch.get_num_threads(), args.steps, device, args.precision)
    elif args.threads:
        results = run_here(names, args.threads, args.steps, device, args.precision)
    else:
        results = run_children(names, args.steps, args.precision)
    for result in results:
        print_result(result, args.json)


if __name__ == "__main__":
    main()
