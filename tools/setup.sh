#!/usr/bin/env bash
# Installs what miniflow needs on Debian 12 (only what is missing) and builds it into build/.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(g++ meson ninja-build pkg-config libopenblas-dev libfmt-dev nlohmann-json3-dev doctest-dev)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo=sudo; fi
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ ! -f build/build.ninja ]; then meson setup build; fi
ninja -C build
