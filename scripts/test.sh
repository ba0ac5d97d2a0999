#!/usr/bin/env bash
# The test command: installs what is missing, builds everything (CUDA sources too where nvcc
# exists, so they cannot rot), and runs the whole ctest suite. GPU tests skip without a GPU. As
# root it also installs what the multi-host tests use (Slurm, munge, iproute2); they need root
# and skip, saying why, without it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -eq 0 ]; then export LFM2_TEST_PACKAGES=${LFM2_TEST_PACKAGES:-1}; fi
scripts/setup.sh
scripts/build.sh
ctest --test-dir "${LFM2_BUILD_DIR:-build}" --output-on-failure -j "${LFM2_TEST_JOBS:-2}" "$@"
