#!/usr/bin/env bash
# Installs what miniflow needs on Debian 12 (only what is missing) and builds it into build/.
#   --with-python-interop   also makes .venv-interop with numpy, safetensors and sacrebleu from PyPI, so
#                           that the safetensors_interop and sacrebleu_interop tests run against Python's
#                           packages instead of skipping
set -euo pipefail
cd "$(dirname "$0")/.."

with_python_interop=0
for arg in "$@"; do
  case "$arg" in
    --with-python-interop) with_python_interop=1 ;;
    *) echo "usage: bash tools/setup.sh [--with-python-interop]" >&2; exit 2 ;;
  esac
done

# OpenMPI for data-parallel training across processes (and mpirun for its tests); procps for pgrep;
# SentencePiece for subword vocabularies.
packages=(g++ meson ninja-build pkg-config libopenblas-dev libfmt-dev nlohmann-json3-dev doctest-dev
          openmpi-bin libopenmpi-dev procps libsentencepiece-dev)
if ((with_python_interop)); then packages+=(python3-venv); fi
bash tools/install_packages.sh "${packages[@]}"

# The build picks .venv-interop's Python when it exists at configure time, so a venv made now for an
# existing build needs a reconfigure.
reconfigure=0
if ((with_python_interop)); then
  venv=.venv-interop
  if [ ! -x "$venv/bin/python3" ]; then
    python3 -m venv "$venv"
    reconfigure=1
  fi
  # sacrebleu is pinned to the version whose rules text/sacrebleu.h follows (kSacrebleuRulesVersion).
  if ! "$venv/bin/python3" -c 'import numpy, safetensors, sacrebleu; assert sacrebleu.__version__ == "2.4.3"' \
       2>/dev/null; then
    echo "installing into $venv: numpy safetensors sacrebleu==2.4.3"
    "$venv/bin/python3" -m pip install -q --disable-pip-version-check 'numpy>=1.24' 'safetensors>=0.4' \
      'sacrebleu==2.4.3'
  fi
fi

if [ ! -f build/build.ninja ]; then
  meson setup build
elif ((reconfigure)); then
  meson setup --reconfigure build
fi
bash tools/refresh_cuda_objects.sh build
ninja -C build
