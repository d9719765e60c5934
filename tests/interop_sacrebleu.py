#!/usr/bin/env python3
"""miniflow's sacreBLEU scores against Python's sacrebleu package, on the same files.

Usage: interop_sacrebleu.py SACREBLEU_HELPER

1. A few hundred generated lines (punctuation, numbers such as 3.5 and 1,000, hyphens, quotes, HTML
   entities, <skipped>, Unicode letters and spaces, empty lines): SACREBLEU_HELPER tokenize must give
   sacrebleu's 13a tokenization of every line, and SACREBLEU_HELPER score must give sacrebleu's BLEU
   (cased, lowercased, tok:none) and chrF (cased, lowercased) of perturbed copies against them, to 0.01,
   with the same lengths and signatures (up to the version, which miniflow names "<rules>-miniflow").
2. The same on Multi30k's validation English (../shared/data/multi30k/val.en from the repository root)
   against a perturbed copy, when that file exists; the test says so when it does not.

Exits 77 (meson's "skipped") when sacrebleu cannot be imported, unless it runs in the project's
.venv-interop (made by `bash tools/setup.sh --with-python-interop`), where that is a failure.
"""

import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-interop"
MULTI30K_ENGLISH = ROOT.parent / "shared" / "data" / "multi30k" / "val.en"
RULES_VERSION = "2.4.3"  # kSacrebleuRulesVersion in text/sacrebleu.h
TOLERANCE = 0.01

try:
    import sacrebleu
    from sacrebleu.metrics import BLEU, CHRF
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a
except ImportError as error:
    in_venv = Path(sys.prefix).resolve() == VENV.resolve()
    print(f"{'FAIL' if in_venv else 'SKIP'}: the sacrebleu interop test needs the Python package sacrebleu "
          f"({error}) in {sys.executable}; `bash tools/setup.sh --with-python-interop` installs it into {VENV}")
    sys.exit(1 if in_venv else 77)

results = {"passed": 0, "failed": 0}


def check(ok, what):
    results["passed" if ok else "failed"] += 1
    print(f"{'ok' if ok else 'FAIL'}: {what}")


# Pieces the generated sentences are built from: the cases 13a treats specially, and Unicode text. The
# cased letters are among those whose lowercase miniflow maps as Python's str.lower() does (text/sacrebleu.h
# names the two exceptions, İ and a word-final Σ, which are left out here).
WORDS = ["the", "The", "dog", "DOG", "runs", "quickly", "über", "Ärger", "café", "ÉCOLE", "Łódź", "ΑΘΗΝΑ",
         "Москва", "中文", "naïve", "don't", "it's", "rock'n'roll", "well-known", "e-mail", "x", "A"]
PIECES = ["3.5", "1,000", "1-2", "2024-01-05", "10.", ",5", "U.S.A.", "a.b", "end.", "hello,world", "(a)",
          "[b]", "{c}", "\"quoted\"", "'single'", "&quot;hi&quot;", "&amp;", "&lt;tag&gt;", "&AMP;", "&#39;",
          "<skipped>", "50%", "$9.99", "#1", "@user", "a/b", "a:b", "x+y=z", "~", "^", "_", "`", "|", "\\",
          "?!", "...", "--", "- -", "—", "“curly”", "¿qué?", "«guillemets»", "…", "€5", "9-", "-9", ".,",
          ",,", "..5", "1.,2", "😀", "tab\there", "nb\u00a0sp", "thin\u2009space", "line\u2028sep", "zw\u200bsp",
          "a-", "-"]


def generated_lines(rng, count):
    lines = []
    for i in range(count):
        if i % 37 == 0:
            lines.append("")
            continue
        length = rng.randint(1, 14)
        tokens = [rng.choice(WORDS) if rng.random() < 0.6 else rng.choice(PIECES) for _ in range(length)]
        # Mostly detokenized text: punctuation glued on, as translations are printed.
        line = "".join(t + ("" if rng.random() < 0.25 else " ") for t in tokens)
        if rng.random() < 0.3:
            line += rng.choice([".", "!", "?", " .", ",", "-", "  ", "\t", "\u00a0"])
        lines.append(line)
    return lines


def perturbed(rng, lines):
    """Copies of `lines` with some words dropped, swapped, replaced or recased, so that scores land
    between 0 and 100 and every n-gram order has both matches and misses."""
    out = []
    for line in lines:
        words = line.split(" ")
        r = rng.random()
        if r < 0.15 and len(words) > 1:
            del words[rng.randrange(len(words))]
        elif r < 0.3 and len(words) > 1:
            k = rng.randrange(len(words) - 1)
            words[k], words[k + 1] = words[k + 1], words[k]
        elif r < 0.45:
            words[rng.randrange(len(words))] = rng.choice(WORDS)
        elif r < 0.6:
            k = rng.randrange(len(words))
            words[k] = words[k].upper() if rng.random() < 0.5 else words[k].lower()
        elif r < 0.65:
            words = []
        out.append(" ".join(words))
    return out


def write_lines(path, lines):
    with open(path, "w", encoding="utf-8", newline="") as file:
        file.write("".join(line + "\n" for line in lines))


def read_lines(path):
    """Lines split on '\\n' only, as the helper's std::getline splits them."""
    with open(path, encoding="utf-8", newline="") as file:
        text = file.read()
    lines = text.split("\n")
    return lines[:-1] if text.endswith("\n") else lines


def run_helper(helper, *args):
    run = subprocess.run([helper, *args], capture_output=True, text=True, encoding="utf-8")
    check(run.returncode == 0, f"sacrebleu_helper {args[0]} exits 0 {run.stderr}".strip())
    return run.stdout.split("\n")[:-1] if run.returncode == 0 else None


def compare_tokenization(helper, path, what):
    got = run_helper(helper, "tokenize", str(path))
    if got is None:
        return
    tokenizer = Tokenizer13a()
    want = [tokenizer(line) for line in read_lines(path)]
    differing = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    check(len(got) == len(want) and not differing,
          f"{what}: 13a tokenization of {len(want)} lines"
          + (f" ({len(got)} lines back)" if len(got) != len(want) else "")
          + "".join(f"\n    line {i + 1}: {read_lines(path)[i]!r}\n      miniflow {got[i]!r}\n      sacrebleu "
                    f"{want[i]!r}" for i in differing[:5]))


SUMMARY = re.compile(r"^(?P<name>[^|]+)\|(?P<signature>\S+) = (?P<score>[0-9.]+)(?P<verbose>.*)$")
LENGTHS = re.compile(r"hyp_len = (\d+) ref_len = (\d+)")


def compare_scores(helper, hyp_path, ref_path, what):
    got = run_helper(helper, "score", str(hyp_path), str(ref_path))
    if got is None:
        return
    hypotheses, references = read_lines(hyp_path), read_lines(ref_path)
    metrics = [("BLEU cased", BLEU()), ("BLEU lowercased", BLEU(lowercase=True)),
               ("BLEU tok:none", BLEU(tokenize="none")), ("chrF cased", CHRF()),
               ("chrF lowercased", CHRF(lowercase=True))]
    check(len(got) == len(metrics), f"{what}: {len(metrics)} score lines: {got}")
    for (label, metric), line in zip(metrics, got):
        score = metric.corpus_score(hypotheses, [references])
        signature = str(metric.get_signature()).replace(f"version:{sacrebleu.__version__}",
                                                        f"version:{RULES_VERSION}-miniflow")
        want = score.format(signature=signature)
        mine, theirs = SUMMARY.match(line), SUMMARY.match(want)
        if mine is None:
            check(False, f"{what}, {label}: unparsable line {line!r}")
            continue
        agree = (mine["name"] == theirs["name"] and mine["signature"] == theirs["signature"]
                 and abs(float(mine["score"]) - score.score) <= TOLERANCE
                 and LENGTHS.findall(mine["verbose"]) == LENGTHS.findall(theirs["verbose"]))
        check(agree, f"{what}, {label}: {score.score:.4f}" if agree else
              f"{what}, {label}:\n    miniflow  {line}\n    sacrebleu {want}")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    helper = sys.argv[1]
    print(f"sacrebleu {sacrebleu.__version__} from {sacrebleu.__file__}")
    if sacrebleu.__version__ != RULES_VERSION:
        print(f"note: miniflow follows sacrebleu {RULES_VERSION}'s rules; this is {sacrebleu.__version__}")
    rng = random.Random(20240613)
    with tempfile.TemporaryDirectory(prefix="miniflow_sacrebleu_") as tmp:
        references = generated_lines(rng, 400)
        hypotheses = perturbed(rng, references)
        ref_path, hyp_path = Path(tmp) / "generated.ref", Path(tmp) / "generated.hyp"
        write_lines(ref_path, references)
        write_lines(hyp_path, hypotheses)
        compare_tokenization(helper, ref_path, "generated references")
        compare_tokenization(helper, hyp_path, "generated hypotheses")
        compare_scores(helper, hyp_path, ref_path, "generated lines")

        if MULTI30K_ENGLISH.is_file():
            multi30k_hyp = Path(tmp) / "multi30k.hyp"
            write_lines(multi30k_hyp, perturbed(rng, read_lines(MULTI30K_ENGLISH)))
            compare_tokenization(helper, MULTI30K_ENGLISH, "Multi30k val.en")
            compare_scores(helper, multi30k_hyp, MULTI30K_ENGLISH, "Multi30k val.en vs a perturbed copy")
        else:
            print(f"note: {MULTI30K_ENGLISH} is absent, so only generated lines were scored")
    print(f"sacrebleu interop: {results['passed']} passed, {results['failed']} failed")
    sys.exit(1 if results["failed"] else 0)


if __name__ == "__main__":
    main()
