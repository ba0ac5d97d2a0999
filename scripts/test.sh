#!/usr/bin/env bash
# The test command: installs what is missing, builds everything (CUDA sources too where nvcc
# exists, so they cannot rot), and runs the whole ctest suite. GPU tests skip without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
ctest --test-dir "${LFM2_BUILD_DIR:-build}" --output-on-failure -j "${LFM2_TEST_JOBS:-2}" "$@"
