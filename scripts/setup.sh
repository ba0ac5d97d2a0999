#!/usr/bin/env bash
# Installs what lfm2-rank needs to build and test (Debian packages), only what is missing.
# Idempotent and quiet when everything is present. Needs root or sudo for apt-get.
set -euo pipefail

packages=(build-essential cmake ninja-build ccache pkg-config
          libopenmpi-dev openmpi-bin libhdf5-dev hdf5-tools
          libgtest-dev nlohmann-json3-dev libcli11-dev)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "setup: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: error: need root or sudo to install ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
