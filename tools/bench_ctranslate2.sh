#!/usr/bin/env bash
# Benchmarks CTranslate2 (CPU, float32 or int8) against miniflow's build/tools/translate on a miniflow subword
# translation checkpoint (tools/bench_ctranslate2.py: converts it, checks both translate alike, times both
# on Multi30k's validation set from ../shared/data). ctranslate2 4.8.5, sentencepiece, numpy and safetensors
# come from PyPI into .venv-ct2 (created on first use, about 250 MB). CT2_FORCE_CPU_ISA and CT2_USE_MKL in
# the environment reach CTranslate2. Benchmarks, not tests: CI does not run this.
#
#   bash tools/bench_ctranslate2.sh --checkpoint CKPT [--threads 1,2] [--beams 1,4] [--repeat 3] [--markdown]
#     [--miniflow-precision int8 --ct2-compute-type int8]   (int8 beside int8)
#     [--shortlist LEXICON]   (both over the same lexical shortlists: translate --shortlist, CTranslate2's vmap)
#   (every argument goes to tools/bench_ctranslate2.py; --help lists them once .venv-ct2 exists)
set -euo pipefail

cd "$(dirname "$0")/.."
venv=.venv-ct2
if [[ " $* " == *" --help "* || " $* " == *" -h "* ]]; then
  sed -n '2,11p' "$0"
  if [[ -x "$venv/bin/python" ]]; then echo; "$venv/bin/python" tools/bench_ctranslate2.py --help; fi
  exit 0
fi

if ! "$venv/bin/python" -c "import ctranslate2, sentencepiece, numpy, safetensors" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
  "$venv/bin/pip" install --quiet ctranslate2==4.8.5 sentencepiece numpy safetensors
fi
exec "$venv/bin/python" tools/bench_ctranslate2.py "$@"
