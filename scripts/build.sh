#!/usr/bin/env bash
# Configures and builds lfm2-rank into ./build (Ninja, ccache). The CUDA backend is built when nvcc
# is found (on PATH or in /usr/local/cuda/bin); LFM2_CUDA=OFF forces a CPU-only build.
# Extra arguments go to ninja (e.g. a target name).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${LFM2_BUILD_DIR:-build}

cuda_args=(-DLFM2_ENABLE_CUDA="${LFM2_CUDA:-ON}")
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  cuda_args+=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
fi

if [ ! -f "$build_dir/build.ninja" ]; then
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cuda_args[@]}" >/dev/null
fi
jobs=${LFM2_JOBS:-$(nproc)}
ninja -C "$build_dir" -j "$jobs" "$@"
