#!/usr/bin/env python3
"""Benchmarks CTranslate2 (CPU, float32 or int8) against miniflow's tools/translate on one miniflow translation
checkpoint, in the same run: converts the checkpoint into a CTranslate2 model, checks that both decode
the first validation sentences greedily to the same text, then times both on the whole validation set
at every thread count and beam width, and reports tokens/s, sentences/s and how often the two print
the same translation.

What is timed: for CTranslate2, Translator.translate_batch over the whole set, the sources already cut
into SentencePiece pieces (tokenization and detokenization outside the timer); for miniflow, the
figure `translate --timing` prints (model loading excluded), with --miniflow-flags added to its
command line (say "--beam-stop finished" for CTranslate2's stopping rule). Both are timed as a user
runs them, in a fresh process whose model is loaded but which has not translated yet: CTranslate2's
runs are made by a child process of this script (--ct2-worker), whose first call counts. CTranslate2's
first call in a process ran 3-19% slower than its later ones on Emerald Rapids (part of it the kernel
clearing the pages a process touches the first time), where miniflow's second pass was no faster than
its first; the child times that second, warm call too, and the ratio against it is printed beside.
At more than one thread CTranslate2 is timed both ways it can use them, splitting each batch's ops
(intra_threads) and decoding whole batches side by side (inter_threads), and the faster counts (the
ratio against intra_threads alone is printed beside it);
miniflow runs translate's default, batches side by side (--batch-workers 0) once there are more batches
than one. Tokens are the generated target pieces without <eos>. Each measurement is repeated --repeat times,
miniflow and CTranslate2 alternating so that the machine's noise hits both, and the fastest is kept.

Beam search ranks finished hypotheses differently in the two: miniflow divides the log-probability by
GNMT's ((5 + length) / 6)^alpha (length counting <eos>), CTranslate2 by length^alpha (length without
<eos>), and CTranslate2 stops a sentence once beam_size hypotheses have finished (with alpha 0, once its
best candidate has), where miniflow stops when no live hypothesis can still enter its best. Both are
timed at the same --length-penalty alpha; the beam agreement is measured on an extra, untimed pair of
runs with alpha 0 (plain sums of log-probabilities), where the two searches rank alike.

With --shortlist LEXICON both decode over Marian's lexical shortlists from the same lex.s2t file: miniflow
with translate --shortlist, CTranslate2 with the same rule written into the converted model as its
vocabulary map (use_vmap). Each takes the union of a batch's candidates, so the two engines' different
batches give somewhat different sets.

The length cap differs too: miniflow caps each of its batches at 1.5 x the batch's longest source + 10
tokens (models::output_budget), CTranslate2 takes one max_decoding_length for the whole set (that
formula on the longest source of the set), so a translation that runs away to the cap is cut at
different lengths and counts as a disagreement.
"""
import argparse
import base64
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import typing

import ctranslate2
import numpy as np
import sentencepiece
from ctranslate2.specs import common_spec, transformer_spec
from safetensors import safe_open

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPECIALS = ("<pad>", "<sos>", "<eos>", "<unk>")  # miniflow's ids 0-3 (text/special_tokens.h)
PAD, SOS, EOS, UNK = range(4)
MINIFLOW_MAX_LEN = 100        # translate's --max-len default
MINIFLOW_TIMING = re.compile(r"translate: (\d+) sentences, (\d+) tokens in ([0-9.]+) s")
VERIFY_SENTENCES = 20
BATCHING_SAMPLE = 256         # sentences on which the CTranslate2 batching settings are tried
BATCHINGS = ((32, "examples"), (64, "examples"), (1024, "tokens"), (2048, "tokens"))
CT2_WORKER = "--ct2-worker"  # argv[1] of ct2_translate_fresh's child process
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile")


class Vocabulary:
    """One side's SentencePiece model in miniflow's id order (text/subword.cpp): the four specials at
    ids 0-3 with miniflow's spellings, then every other SentencePiece piece in SentencePiece's order."""

    def __init__(self, model_bytes):
        self.sp = sentencepiece.SentencePieceProcessor(model_proto=model_bytes)
        special_ids = [self.sp.pad_id(), self.sp.bos_id(), self.sp.eos_id(), self.sp.unk_id()]
        self.to_sp = list(special_ids)
        self.from_sp = {sp_id: mf_id for mf_id, sp_id in enumerate(special_ids) if sp_id >= 0}
        self.pieces = list(SPECIALS)
        for sp_id in range(self.sp.get_piece_size()):
            if sp_id in self.from_sp:
                continue
            self.from_sp[sp_id] = len(self.pieces)
            self.to_sp.append(sp_id)
            self.pieces.append(self.sp.id_to_piece(sp_id))
        self.index = {piece: mf_id for mf_id, piece in enumerate(self.pieces)}
        self.byte_fallback = any(self.sp.is_byte(i) for i in range(self.sp.get_piece_size()))
        # TextCodec::ids_by_frequency: the specials, the learned pieces in SentencePiece's order, the bytes.
        is_byte = [mf_id >= len(SPECIALS) and self.sp.is_byte(self.to_sp[mf_id]) for mf_id in range(len(self.pieces))]
        self.ids_by_frequency = sorted(range(len(self.pieces)), key=lambda mf_id: is_byte[mf_id])

    def encode(self, text, limit):
        """The pieces of `text` as miniflow's vocabulary spells them, at most `limit` of them."""
        return [self.pieces[self.from_sp[i]] for i in self.sp.encode(text)][:limit]

    def decode(self, pieces):
        """Text of generated pieces as miniflow decodes ids: up to <eos>, skipping <pad> and <sos>."""
        ids = []
        for piece in pieces:
            mf_id = self.index[piece]
            if mf_id == EOS:
                break
            if mf_id not in (PAD, SOS):
                ids.append(self.to_sp[mf_id])
        return self.sp.decode(ids)


def read_checkpoint(path):
    """The checkpoint's Transformer config, its source and target Vocabulary (the same object when the
    target is "same as source"), and its model tensors by state_dict key (without "model.")."""
    with safe_open(path, framework="numpy") as f:
        metadata = f.metadata() or {}
        if "translation.config" not in metadata:
            sys.exit(f"bench_ctranslate2.py: '{path}' is not a miniflow translation checkpoint")
        codecs = {side: json.loads(metadata.get(f"translation.{side}", '{"kind":"words"}'))
                  for side in ("source", "target")}
        for side, codec in codecs.items():
            if codec["kind"] not in ("sentencepiece", "same as source"):
                sys.exit(f"bench_ctranslate2.py: '{path}' has a {codec['kind']} {side} vocabulary; the benchmark "
                         "needs a subword (SentencePiece) checkpoint")
        config = json.loads(metadata["translation.config"])
        tensors = {key[len("model."):]: f.get_tensor(key) for key in f.keys() if key.startswith("model.")}
    source = Vocabulary(base64.b64decode(codecs["source"]["model"]))
    target = source if codecs["target"]["kind"] == "same as source" else Vocabulary(
        base64.b64decode(codecs["target"]["model"]))
    for side, vocab, size in (("source", source, config["src_vocab"]), ("target", target, config["tgt_vocab"])):
        if len(vocab.pieces) != size:
            sys.exit(f"bench_ctranslate2.py: the {side} SentencePiece model has {len(vocab.pieces)} pieces "
                     f"but the config's vocabulary has {size}")
    return config, source, target, tensors


def positional_table(max_len, d_model):
    """miniflow's sinusoidal table [max_len, C] (nn/positional_encoding.cpp): column j of position p is
    sin (j even) or cos (j odd) of p * exp(2i * -ln(10000) / C), i = j // 2; CTranslate2's own table
    puts all sines before all cosines, so the converted model carries this one."""
    pair = np.arange(d_model) // 2 * 2
    angles = np.arange(max_len)[:, None] * np.exp(pair * (-np.log(10000.0) / d_model))[None, :]
    return np.where(np.arange(d_model) % 2 == 0, np.sin(angles), np.cos(angles)).astype(np.float32)


def set_linear(spec, tensors, *names):
    """Fills a LinearSpec with the named Linear modules' weight [out, in] and bias, concatenated along
    the output features when there are several (fused q/k/v or k/v)."""
    spec.weight = np.concatenate([tensors[f"{name}.weight"] for name in names])
    spec.bias = np.concatenate([tensors[f"{name}.bias"] for name in names])


def set_norm(spec, tensors, name):
    """Fills a LayerNormSpec with the named LayerNorm's weight and bias."""
    spec.gamma = tensors[f"{name}.weight"]
    spec.beta = tensors[f"{name}.bias"]


def set_self_attention_and_ffn(layer, tensors, prefix, ffn_norm):
    """Fills an encoder or decoder layer's self-attention (q/k/v fused into linear_0, norm1) and
    feed-forward sublayers (its norm is norm2 in an encoder layer, norm3 in a decoder layer)."""
    attention = f"{prefix}.self_attn"
    set_linear(layer.self_attention.linear[0], tensors, f"{attention}.q_proj", f"{attention}.k_proj",
               f"{attention}.v_proj")
    set_linear(layer.self_attention.linear[1], tensors, f"{attention}.out_proj")
    set_norm(layer.self_attention.layer_norm, tensors, f"{prefix}.norm1")
    set_linear(layer.ffn.linear_0, tensors, f"{prefix}.ffn.linear1")
    set_linear(layer.ffn.linear_1, tensors, f"{prefix}.ffn.linear2")
    set_norm(layer.ffn.layer_norm, tensors, f"{prefix}.{ffn_norm}")


def convert(config, source, target, tensors, output_dir, vocabulary_map=None):
    """Writes the checkpoint as a CTranslate2 TransformerSpec model into output_dir, with the
    vocabulary_map file (write_vocabulary_map's) as the model's vmap.txt when one is given.

    Post-norm CTranslate2 layers apply each sublayer's layer_norm after its residual sum, pre-norm
    ones before the sublayer, as miniflow's norm1/2/3 do; the pre-norm stacks' final norm is the
    stack's layer_norm. The self-attention's q/k/v projections are fused into linear_0, the
    cross-attention's k/v into linear_1."""
    t = tensors
    activation = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU}[config["activation"]]
    spec = transformer_spec.TransformerSpec.from_config(
        (config["encoder_layers"], config["decoder_layers"]), config["heads"], pre_norm=config["pre_norm"],
        activation=activation)
    src_embed, tgt_embed = ("embed", "embed") if config["shared_embeddings"] else ("src_embed", "tgt_embed")
    positions = positional_table(config["max_len"], config["d_model"])

    encoder = spec.encoder
    encoder.embeddings[0].weight = t[f"{src_embed}.weight"]
    encoder.position_encodings.encodings = positions
    for i, layer in enumerate(encoder.layer):
        set_self_attention_and_ffn(layer, t, f"encoder.layers.{i}", ffn_norm="norm2")

    decoder = spec.decoder
    decoder.embeddings.weight = t[f"{tgt_embed}.weight"]
    decoder.position_encodings.encodings = positions
    decoder.projection.weight = t[f"{tgt_embed}.weight"] if config["tie_output"] else t["output_proj.weight"]
    for i, layer in enumerate(decoder.layer):
        p = f"decoder.layers.{i}"
        set_self_attention_and_ffn(layer, t, p, ffn_norm="norm3")
        set_linear(layer.attention.linear[0], t, f"{p}.cross_attn.q_proj")
        set_linear(layer.attention.linear[1], t, f"{p}.cross_attn.k_proj", f"{p}.cross_attn.v_proj")
        set_linear(layer.attention.linear[2], t, f"{p}.cross_attn.out_proj")
        set_norm(layer.attention.layer_norm, t, f"{p}.norm2")
    if config["pre_norm"]:
        set_norm(encoder.layer_norm, t, "encoder.norm")
        set_norm(decoder.layer_norm, t, "decoder.norm")

    spec.register_source_vocabulary(source.pieces)
    spec.register_target_vocabulary(target.pieces)
    spec.config.unk_token = SPECIALS[UNK]
    spec.config.bos_token = SPECIALS[SOS]
    spec.config.eos_token = SPECIALS[EOS]
    spec.config.decoder_start_token = SPECIALS[SOS]
    spec.config.add_source_eos = True  # miniflow's encoder reads the tokens + <eos>, no <sos>
    spec.config.layer_norm_epsilon = config["layer_norm_eps"]
    if vocabulary_map:
        spec.register_vocabulary_mapping(vocabulary_map)
    spec.validate()
    spec.optimize(quantization="float32")  # also stores the tied embedding / projection once
    spec.save(output_dir)


def write_vocabulary_map(lexicon_path, source, target, first, best, path):
    """Writes the shortlists translate --shortlist takes from a lex.s2t lexicon (Lexicon::shortlist, Marian's
    rule) as a CTranslate2 vocabulary map at `path`: the empty n-gram's line lists the target vocabulary's
    `first` most frequent pieces (always candidates), and each source piece's line its `best` most probable
    translations (ties: the lower target id first) and, where one vocabulary serves both sides, the piece
    itself. CTranslate2 adds its specials to a batch's candidates, as miniflow adds <eos>."""
    translations = {}
    with open(lexicon_path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            fields = line.split()
            if len(fields) != 3 or fields[0] not in target.index or fields[1] not in source.index:
                sys.exit(f"bench_ctranslate2.py: {lexicon_path}:{number}: not a 'target source probability' line "
                         "over this checkpoint's pieces")
            translations.setdefault(fields[1], []).append((-float(fields[2]), target.index[fields[0]]))
    shared = source is target
    lines = ["\t" + " ".join(target.pieces[i] for i in target.ids_by_frequency[:first])]
    for piece in source.pieces[len(SPECIALS):]:
        candidates = [target.pieces[t] for _, t in sorted(translations.get(piece, []))[:best]]
        if shared:
            candidates.append(piece)
        if candidates:
            lines.append(piece + "\t" + " ".join(candidates))
    write_lines(path, lines)


def output_budget(longest_source, max_len):
    """Most tokens generated per sentence, <eos> included, as models::output_budget caps translate's
    --max-len: 1.5 x the longest source (with its <eos>) + 10, within the model's max_len - 1."""
    return min(MINIFLOW_MAX_LEN, max_len - 1, longest_source * 3 // 2 + 10)


class Ct2Limits(typing.NamedTuple):
    """What every CTranslate2 call of the benchmark shares: the length cap, whether <unk> is banned, and
    whether each batch decodes over its vocabulary map's candidates only."""
    max_decoding_length: int
    disable_unk: bool
    use_vmap: bool


def ct2_translate(translator, sources, beam, length_penalty, batching, limits):
    """Translates pre-tokenized sources with CTranslate2 within `limits`; returns the best hypotheses'
    pieces and the seconds translate_batch took."""
    max_batch_size, batch_type = batching
    todo = [i for i, pieces in enumerate(sources) if pieces]  # miniflow prints an empty line for an empty one
    batch = [sources[i] for i in todo]
    start = time.perf_counter()
    results = translator.translate_batch(
        batch, beam_size=beam, length_penalty=length_penalty, max_batch_size=max_batch_size,
        batch_type=batch_type, disable_unk=limits.disable_unk, max_input_length=0,
        max_decoding_length=limits.max_decoding_length,
        use_vmap=limits.use_vmap)
    seconds = time.perf_counter() - start
    best = [[] for _ in sources]
    for i, result in zip(todo, results):
        best[i] = result.hypotheses[0]
    return best, seconds


class Miniflow:
    """Runs build/tools/translate on a file (with --timing and the given extra flags) and reads its
    timing line."""

    def __init__(self, binary, checkpoint, extra_flags, precision, shortlist_flags):
        if not os.access(binary, os.X_OK):
            sys.exit(f"bench_ctranslate2.py: no miniflow translate binary at '{binary}' (ninja -C build)")
        self.binary, self.checkpoint, self.extra_flags, self.precision = binary, checkpoint, extra_flags, precision
        self.shortlist_flags = shortlist_flags

    def translate(self, input_path, threads, beam, length_penalty, precision=None, shortlist=True):
        """Returns (output lines, tokens, seconds), tokens and seconds as --timing prints them; in the
        benchmark's --miniflow-precision unless `precision` says otherwise, over the benchmark's shortlist
        (if any) unless `shortlist` is False."""
        command = [self.binary, "--checkpoint", self.checkpoint, "--input", input_path, "--threads", str(threads),
                   "--beam", str(beam), "--length-penalty", str(length_penalty), "--timing",
                   "--precision", precision or self.precision] + self.extra_flags
        if shortlist:
            command += self.shortlist_flags
        run = subprocess.run(command, capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"bench_ctranslate2.py: {' '.join(command)} failed ({run.returncode}):\n{run.stderr}")
        match = MINIFLOW_TIMING.search(run.stderr)
        if not match:
            sys.exit(f"bench_ctranslate2.py: no timing line in translate's stderr:\n{run.stderr}")
        return run.stdout.split("\n")[:-1], int(match.group(2)), float(match.group(3))


def ct2_translate_fresh(model_dir, compute_type, split, sources, beam, length_penalty, batching, limits, scratch):
    """ct2_translate in a new process (--ct2-worker) whose Translator has not translated yet, twice:
    returns the pieces and the seconds of its first (cold) and second (warm) call."""
    request, result = os.path.join(scratch, "ct2_request.json"), os.path.join(scratch, "ct2_result.json")
    with open(request, "w", encoding="utf-8") as f:
        json.dump({"model_dir": model_dir, "compute_type": compute_type, "split": split, "sources": sources,
                   "beam": beam, "length_penalty": length_penalty, "batching": batching,
                   "limits": limits._asdict()}, f)
    subprocess.run([sys.executable, os.path.abspath(__file__), CT2_WORKER, request, result], check=True)
    with open(result, encoding="utf-8") as f:
        answer = json.load(f)
    return answer["pieces"], answer["cold_s"], answer["warm_s"]


def ct2_worker(request_path, result_path):
    """The child process of ct2_translate_fresh."""
    with open(request_path, encoding="utf-8") as f:
        r = json.load(f)
    inter, intra = r["split"]
    translator = ctranslate2.Translator(r["model_dir"], device="cpu", compute_type=r["compute_type"],
                                        inter_threads=inter, intra_threads=intra)
    run = [r["sources"], r["beam"], r["length_penalty"], tuple(r["batching"]), Ct2Limits(**r["limits"])]
    pieces, cold = ct2_translate(translator, *run)
    _, warm = ct2_translate(translator, *run)
    with open(result_path, "w", encoding="utf-8") as f:
        json.dump({"pieces": pieces, "cold_s": cold, "warm_s": warm}, f)


def ct2_backend(model_dir):
    """How CTranslate2 runs here (ISA, Intel MKL, SGEMM backend), from its CT2_VERBOSE log of loading
    the model in a child process (CT2_FORCE_CPU_ISA and CT2_USE_MKL in the environment apply)."""
    code = f"import ctranslate2; ctranslate2.Translator({model_dir!r}, compute_type='float32')"
    log = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, CT2_VERBOSE="1"), capture_output=True,
                         text=True).stderr
    found = re.findall(r"- (Selected ISA|Use Intel MKL|SGEMM backend): (.*)", log)
    return ", ".join(f"{key} {value.strip()}" for key, value in found) or "unknown (no CT2_VERBOSE log)"


def agreement(a, b):
    return sum(x == y for x, y in zip(a, b)) / len(a)


def cpu_description():
    """The CPU's model name with its family and model numbers (as miniflow's tools print it) and which of
    CPU_FLAGS it has, from the first processor's block of /proc/cpuinfo."""
    fields, flags = {}, []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
        flags = [flag for flag in CPU_FLAGS if flag in fields.get("flags", "").split()]
    except OSError:
        pass
    name = fields.get("model name", "unknown CPU")
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    return name, flags


def read_lines(path, what):
    if not os.path.isfile(path):
        sys.exit(f"bench_ctranslate2.py: Multi30k not found at {path}; the benchmark needs ../shared/data "
                 f"(the {what} file)")
    with open(path, encoding="utf-8") as f:
        return f.read().split("\n")[:-1]


def write_lines(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))


def choose_batching(translator, sources, beam, length_penalty, limits):
    """The fastest of BATCHINGS for this beam on the first BATCHING_SAMPLE sources."""
    sample = sources[:BATCHING_SAMPLE]
    times = {b: ct2_translate(translator, sample, beam, length_penalty, b, limits)[1] for b in BATCHINGS}
    best = min(times, key=times.get)
    tried = ", ".join(f"{size} {kind} {seconds:.3f} s" for (size, kind), seconds in times.items())
    print(f"beam {beam}: CTranslate2 batching tried on {len(sample)} sentences: {tried}; "
          f"using max_batch_size={best[0]}, batch_type=\"{best[1]}\"", file=sys.stderr)
    return best


def verify(miniflow, translator, lines, sources, target, output_dir, limits):
    """Exits unless CTranslate2's greedy translations of the first VERIFY_SENTENCES sources are the text
    miniflow prints for them, both in float32 over the whole vocabulary: the converted model must compute
    what miniflow computes."""
    path = os.path.join(output_dir, "verify.src")
    write_lines(path, lines[:VERIFY_SENTENCES])
    expected, _, _ = miniflow.translate(path, 1, 1, 0.0, precision="fp32", shortlist=False)
    pieces, _ = ct2_translate(translator, sources[:VERIFY_SENTENCES], 1, 0.0, (64, "examples"),
                              limits._replace(use_vmap=False))
    got = [target.decode(p) for p in pieces]
    wrong = [(i, e, g) for i, (e, g) in enumerate(zip(expected, got)) if e != g]
    if wrong:
        details = "\n".join(f"  line {i + 1}:\n    miniflow:    {e}\n    CTranslate2: {g}" for i, e, g in wrong)
        sys.exit(f"bench_ctranslate2.py: the converted model disagrees with miniflow on {len(wrong)} of the first "
                 f"{len(expected)} sentences (greedy), a conversion bug:\n{details}")
    print(f"conversion verified: CTranslate2 greedy = miniflow greedy on the first {len(expected)} sentences",
          file=sys.stderr)


def benchmark(args, miniflow, model_dir, lines, sources, target, limits):
    """One row per (threads, beam): the fastest of --repeat alternated runs of each, and the agreement."""
    input_path = os.path.join(args.output_dir, "source.txt")
    write_lines(input_path, lines)
    rows, batchings = [], {}
    for threads in args.threads:
        # CTranslate2 splits its threads within each batch (intra_threads) or runs whole batches side by
        # side (inter_threads); each repeat times both ways and the faster counts.
        splits = [(1, threads)] + ([(threads, 1)] if threads > 1 else [])
        # In this process only to choose the batching and for the untimed agreement runs.
        translator = ctranslate2.Translator(model_dir, device="cpu", compute_type=args.ct2_compute_type,
                                            intra_threads=threads)
        for beam in args.beams:
            lp = args.length_penalty if beam > 1 else 0.0
            if beam not in batchings:
                batchings[beam] = choose_batching(translator, sources, beam, lp, limits)
            best_mf, best_ct2, best_warm = None, {}, float("inf")  # best_ct2: per split, (tokens, seconds)
            for _ in range(args.repeat):
                mf_lines, mf_tokens, mf_seconds = miniflow.translate(input_path, threads, beam, lp)
                if best_mf is None or mf_seconds < best_mf[1]:
                    best_mf = (mf_tokens, mf_seconds)
                for split in splits:
                    pieces, ct2_seconds, warm_seconds = ct2_translate_fresh(
                        model_dir, args.ct2_compute_type, split, sources, beam, lp, batchings[beam], limits,
                        args.output_dir)
                    if split not in best_ct2 or ct2_seconds < best_ct2[split][1]:
                        best_ct2[split] = (sum(len(p) for p in pieces), ct2_seconds)
                    best_warm = min(best_warm, warm_seconds)
            fastest = min(best_ct2, key=lambda split: best_ct2[split][1])
            ct2_lines = [target.decode(p) for p in pieces]
            agree_lp = lp
            if beam > 1 and lp != 0:  # the two penalties differ: compare the searches at alpha 0
                agree_lp = 0.0
                mf_lines = miniflow.translate(input_path, threads, beam, 0.0)[0]
                pieces, _ = ct2_translate(translator, sources, beam, 0.0, batchings[beam], limits)
                ct2_lines = [target.decode(p) for p in pieces]
            tag = f"t{threads}.b{beam}"
            write_lines(os.path.join(args.output_dir, f"miniflow.{tag}.txt"), mf_lines)
            write_lines(os.path.join(args.output_dir, f"ctranslate2.{tag}.txt"), ct2_lines)
            rows.append({"threads": threads, "beam": beam, "length_penalty": lp, "agreement_length_penalty": agree_lp,
                         "miniflow_tokens": best_mf[0], "miniflow_s": best_mf[1], "ct2_tokens": best_ct2[fastest][0],
                         "ct2_s": best_ct2[fastest][1], "ct2_split": fastest, "ct2_intra_s": best_ct2[splits[0]][1],
                         "ct2_warm_s": best_warm,
                         "agreement": agreement(mf_lines, ct2_lines), "batching": batchings[beam]})
            print(format_row(rows[-1], len(lines)), file=sys.stderr)
    return rows


def split_name(split):
    """How CTranslate2's threads were used: "inter 2 x intra 1"."""
    return f"inter {split[0]} x intra {split[1]}"


def format_row(r, sentences):
    mf_tps, ct2_tps = r["miniflow_tokens"] / r["miniflow_s"], r["ct2_tokens"] / r["ct2_s"]
    return (f"threads {r['threads']} beam {r['beam']}: miniflow {mf_tps:.0f} tok/s {sentences / r['miniflow_s']:.1f} "
            f"sent/s, CTranslate2 {ct2_tps:.0f} tok/s {sentences / r['ct2_s']:.1f} sent/s "
            f"({split_name(r['ct2_split'])}), "
            f"miniflow/CT2 {r['ct2_s'] / r['miniflow_s']:.2f}x (against intra_threads={r['threads']} alone "
            f"{r['ct2_intra_s'] / r['miniflow_s']:.2f}x, against its warm call "
            f"{r['ct2_warm_s'] / r['miniflow_s']:.2f}x), "
            f"agreement {100 * r['agreement']:.1f}%")


def table(rows, sentences, markdown):
    """The results table, plain text or Markdown. The ratio is miniflow's sentences/s over CTranslate2's
    (the same sentences, so the inverse ratio of their times)."""
    header = ["threads", "beam", "miniflow tok/s", "CT2 tok/s", "miniflow sent/s", "CT2 sent/s", "miniflow/CT2",
              "agreement", "CT2 threads", "miniflow/CT2 at intra_threads", "miniflow/CT2 warm"]
    body = []
    for r in rows:
        agree = f"{100 * r['agreement']:.1f}%"
        if r["agreement_length_penalty"] != r["length_penalty"]:
            agree += f" (alpha {r['agreement_length_penalty']:g})"
        body.append([str(r["threads"]), str(r["beam"]), f"{r['miniflow_tokens'] / r['miniflow_s']:.0f}",
                     f"{r['ct2_tokens'] / r['ct2_s']:.0f}", f"{sentences / r['miniflow_s']:.1f}",
                     f"{sentences / r['ct2_s']:.1f}", f"{r['ct2_s'] / r['miniflow_s']:.2f}x", agree,
                     split_name(r["ct2_split"]), f"{r['ct2_intra_s'] / r['miniflow_s']:.2f}x",
                     f"{r['ct2_warm_s'] / r['miniflow_s']:.2f}x"])
    if markdown:
        return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] +
                         ["| " + " | ".join(row) + " |" for row in body])
    widths = [max(len(row[i]) for row in [header] + body) for i in range(len(header))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in [header] + body)


def int_list(text):
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of integers")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"'{text}': every value must be at least 1")
    return values


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    data = os.path.join(os.path.dirname(REPO), "shared", "data", "multi30k")
    parser.add_argument("--checkpoint", required=True, help="miniflow translation checkpoint (.safetensors)")
    parser.add_argument("--source", default=os.path.join(data, "val.de"),
                        help="sentences to translate (default: Multi30k's val.de)")
    parser.add_argument("--reference", default=os.path.join(data, "val.en"),
                        help="their reference translations (only checked to match the source's line count)")
    parser.add_argument("--threads", type=int_list, default=[1, 2],
                        help="comma-separated thread counts (default 1,2)")
    parser.add_argument("--beams", type=int_list, default=[1, 4],
                        help="comma-separated beam widths, 1 = greedy (default 1,4)")
    parser.add_argument("--length-penalty", type=float, default=0.6,
                        help="beam search's alpha, given to both; each applies its own formula (default 0.6)")
    parser.add_argument("--miniflow-translate", default=os.path.join(REPO, "build", "tools", "translate"),
                        help="the miniflow translate binary (default build/tools/translate)")
    parser.add_argument("--miniflow-flags", default="",
                        help="more flags for miniflow's translate, space-separated (e.g. \"--beam-stop finished\")")
    parser.add_argument("--miniflow-precision", choices=["fp32", "bf16", "int8"], default="fp32",
                        help="translate's --precision for the timed runs (default fp32; int8 to set beside "
                             "--ct2-compute-type int8); the conversion is checked in fp32 either way")
    parser.add_argument("--output-dir", help="keep the converted model and all translations here "
                        "(default: a temporary directory, removed at the end)")
    parser.add_argument("--ct2-compute-type", default="float32",
                        help="CTranslate2's compute type for the timed runs (float32, int8, int8_float32: "
                             "ctranslate2.get_supported_compute_types('cpu') lists this CPU's); the conversion is "
                             "checked in float32 either way")
    parser.add_argument("--shortlist", metavar="LEXICON",
                        help="decode both over lexical shortlists from this lex.s2t (build_lexicon's): miniflow "
                             "with translate --shortlist, CTranslate2 with the same rule written as its vocabulary "
                             "map (use_vmap); the conversion is checked over the whole vocabulary either way")
    parser.add_argument("--shortlist-first", type=int, default=100,
                        help="with --shortlist: the target vocabulary's first ids always kept (default 100)")
    parser.add_argument("--shortlist-best", type=int, default=100,
                        help="with --shortlist: each source piece's most probable translations kept (default 100)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement, the fastest kept (default 3)")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown, for BENCHMARKS.md")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.shortlist_first < 0 or args.shortlist_best < 0:
        parser.error("--shortlist-first and --shortlist-best must be at least 0")
    if args.shortlist and not os.path.isfile(args.shortlist):
        sys.exit(f"bench_ctranslate2.py: no lexicon at '{args.shortlist}'")
    shortlist_flags = ["--shortlist", args.shortlist, "--shortlist-first", str(args.shortlist_first),
                       "--shortlist-best", str(args.shortlist_best)] if args.shortlist else []
    lines = read_lines(args.source, "source")
    if len(read_lines(args.reference, "reference")) != len(lines):
        sys.exit(f"bench_ctranslate2.py: {args.reference} and {args.source} have different line counts")
    if not os.path.isfile(args.checkpoint):
        sys.exit(f"bench_ctranslate2.py: no checkpoint at '{args.checkpoint}'")
    miniflow = Miniflow(args.miniflow_translate, args.checkpoint, args.miniflow_flags.split(), args.miniflow_precision,
                        shortlist_flags)

    with tempfile.TemporaryDirectory(prefix="bench_ctranslate2.") as scratch:
        args.output_dir = args.output_dir or scratch
        model_dir = os.path.join(args.output_dir, "ctranslate2_model")
        os.makedirs(model_dir, exist_ok=True)
        config, source, target, tensors = read_checkpoint(args.checkpoint)
        vocabulary_map = None
        if args.shortlist:
            vocabulary_map = os.path.join(args.output_dir, "vmap.txt")
            write_vocabulary_map(args.shortlist, source, target, args.shortlist_first, args.shortlist_best,
                                 vocabulary_map)
        convert(config, source, target, tensors, model_dir, vocabulary_map)
        del tensors
        sources = [source.encode(line, config["max_len"] - 1) for line in lines]
        # miniflow bans <unk> only when the target spells every text
        limits = Ct2Limits(max_decoding_length=output_budget(max(len(s) for s in sources) + 1, config["max_len"]),
                           disable_unk=target.byte_fallback, use_vmap=vocabulary_map is not None)
        print(f"converted to {model_dir}; {limits}", file=sys.stderr)
        verify_translator = ctranslate2.Translator(model_dir, device="cpu", compute_type="float32", intra_threads=1)
        verify(miniflow, verify_translator, lines, sources, target, args.output_dir, limits)
        del verify_translator
        backend = ct2_backend(model_dir)
        rows = benchmark(args, miniflow, model_dir, lines, sources, target, limits)

    cpu, flags = cpu_description()
    timing = " ".join(["translate --timing --precision", args.miniflow_precision] + miniflow.extra_flags +
                      shortlist_flags)
    batching = ", ".join(f"beam {r['beam']}: {r['batching'][0]} {r['batching'][1]}"
                         for r in rows if r["threads"] == args.threads[0])
    beam_agreement = "; beam agreement measured at alpha 0" if args.length_penalty != 0 else ""
    notes = [f"CPU: {cpu} (flags: {', '.join(flags) or 'none of ' + ', '.join(CPU_FLAGS)}), {os.cpu_count()} cores",
             f"{len(lines)} sentences of {os.path.relpath(args.source, REPO)}; length penalty alpha "
             f"{args.length_penalty:g} for beam > 1 (miniflow GNMT ((5 + len) / 6)^alpha, CTranslate2 "
             f"len^alpha){beam_agreement}",
             f"miniflow timed by {timing}; CTranslate2 {ctranslate2.__version__}, {args.ct2_compute_type} ({backend}), "
             f"translate_batch only, batching {batching}" + (
                 f", use_vmap over the same shortlists ({args.shortlist_first} first pieces, each source piece's "
                 f"{args.shortlist_best} best translations)" if args.shortlist else ""),
             "miniflow/CT2 = miniflow's sentences/s / CTranslate2's at its faster use of the threads (CT2 "
             "threads), then / CTranslate2's at intra_threads = threads, and in the last column / its second call "
             "in the same process at its faster use of the threads (warm); agreement = output lines equal"]
    print(table(rows, len(lines), args.markdown))
    print()
    if args.markdown:
        command = "bash tools/bench_ctranslate2.sh " + " ".join(sys.argv[1:])
        print(f"Command: `{command}`, {datetime.date.today().isoformat()}, ctranslate2 {ctranslate2.__version__}.")
        print()
        print("\n".join(f"- {note}" for note in notes))
    else:
        print("\n".join(notes))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == CT2_WORKER:
        ct2_worker(sys.argv[2], sys.argv[3])
    else:
        main()
