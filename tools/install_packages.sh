#!/usr/bin/env bash
# Installs those of the Debian packages named as arguments that are missing (apt-get; sudo unless root).
#   bash tools/install_packages.sh PACKAGE...
set -euo pipefail
missing=()
for package in "$@"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" || missing+=("$package")
done
((${#missing[@]})) || exit 0
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo=sudo; fi
echo "installing: ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
