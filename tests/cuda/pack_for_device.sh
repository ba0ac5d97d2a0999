#!/usr/bin/env bash
# Builds the CUDA tests and benchmarks here and packs them, with the non-system shared libraries
# they load (HDF5 and its dependencies; cuBLAS is taken from the GPU machine's CUDA), into
# .devpack/carry.tar.xz for a lent GPU machine whose image has nvcc but not this project's
# development packages. Usage: tests/cuda/pack_for_device.sh [build-dir]   (default build-cuda)
# On the GPU machine (carry .devpack):
#   mkdir -p /tmp/dc && python3 -c "import tarfile; tarfile.open('.devpack/carry.tar.xz').extractall('/tmp/dc')"
#   CUB=$(dirname $(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13*' | head -1))
#   export LD_LIBRARY_PATH=/tmp/dc/lib:$CUB:$LD_LIBRARY_PATH
#   /tmp/dc/bin/cuda_ops_test && /tmp/dc/bin/cuda_stage_test && /tmp/dc/bin/cuda_bench_kernels
# or copy tests/cuda/device_check.sh (and ../shared/bench/roofline.py) beside carry.tar.xz and run it
# there: every step with its logs and a summary.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-cuda}
cmake -S "$root" -B "$build" -G Ninja -DLFM2_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > /dev/null
bins=(cuda_ops_test cuda_stage_test cuda_bench_kernels cuda_bench_stage)
ninja -C "$build" -j2 "${bins[@]}"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$root/.devpack"
for b in "${bins[@]}"; do cp "$build/tests/cuda/$b" "$stage/bin/"; done
strip --strip-unneeded "$stage"/bin/*
# everything ldd resolves except the C/C++ runtime (the GPU image's is newer) and cuBLAS (huge; there)
for l in $(ldd "$stage/bin/cuda_stage_test" | awk '/=>/ {print $3}' |
           grep -v -E '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libcublas|libcublasLt)\.so'); do
  cp -L "$l" "$stage/lib/"
done
tar cf - -C "$stage" bin lib | xz -6 -T2 > "$root/.devpack/carry.tar.xz"
exclude=$(git -C "$root" rev-parse --path-format=absolute --git-path info/exclude)  # a worktree's too
mkdir -p "$(dirname "$exclude")"
grep -qx '/.devpack/' "$exclude" 2>/dev/null || echo '/.devpack/' >> "$exclude"
ls -la "$root/.devpack/carry.tar.xz"
