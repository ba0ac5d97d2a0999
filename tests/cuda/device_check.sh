#!/usr/bin/env bash
# Runs the CUDA tests and benchmarks packed by pack_for_device.sh on a lent GPU machine, one step
# after another, each under its own time limit, with every log kept, and prints a summary last.
# Usage (on the GPU machine, from the folder holding carry.tar.xz and, optionally, roofline.py):
#   OUT=/some/dir STEPS="ops stage kbench roofline sbench memcheck" tests/cuda/device_check.sh
# Steps:
#   ops       cuda_ops_test (every op vs its CPU twin)           stage    cuda_stage_test
#   opsfused  the SwiGLU-fused grouped GEMM tests alone (a device trap there cannot take the rest down)
#   kbench    cuda_bench_kernels $KBENCH_MODE (default sweep)    roofline torchrun roofline.py (torch peers)
#   sbench    cuda_bench_stage /tmp $SBENCH_SHAPES $SBENCH_DTYPES
#   sbench_unpinned   the same in bf16 with LFM2_GEMM_PIN=0
#   memcheck  compute-sanitizer memcheck on $MEMCHECK_FILTER    racecheck  the same, racecheck, $RACECHECK_FILTER
# The logs are packed into $OUT/logs.tar.gz; $OUT/summary.txt has each step's exit code and time
# and the benchmarks' headline lines.
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:?set OUT}
steps=${STEPS:-ops stage kbench roofline sbench memcheck}
pack=/tmp/lfm2pack
logs=$out/logs
mkdir -p "$pack" "$logs"
python3 -c "import tarfile; tarfile.open('$here/carry.tar.xz').extractall('$pack')"
cub=$(dirname "$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$pack/lib:$cub:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
summary=$out/summary.txt
: > "$summary"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
  > "$logs/gpu.txt" 2>&1
cat "$logs/gpu.txt" >> "$summary"

step() {  # step NAME LIMIT_S command...
  local name=$1 limit=$2
  shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$logs/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc, $(( $(date +%s) - t0 )) s" | tee -a "$summary"
}

for s in $steps; do
  case $s in
    opsfused) step opsfused "${OPS_LIMIT:-240}" "$pack/bin/cuda_ops_test" --gtest_filter='*Swiglu*:*MoeExperts*'
              grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran" "$logs/opsfused.log" | tail -20 >> "$summary" ;;
    ops) step ops "${OPS_LIMIT:-240}" "$pack/bin/cuda_ops_test" ${OPS_FILTER:+--gtest_filter=$OPS_FILTER}
         grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran" "$logs/ops.log" | tail -40 >> "$summary" ;;
    stage) step stage "${STAGE_LIMIT:-200}" "$pack/bin/cuda_stage_test"
           grep -E "\[cuda stage\]|^\[  (PASSED|FAILED)|FAILED  \]|tests ran" "$logs/stage.log" >> "$summary" ;;
    kbench) step kbench "${KBENCH_LIMIT:-200}" "$pack/bin/cuda_bench_kernels" ${KBENCH_MODE-sweep}
            grep -v "^$" "$logs/kbench.log" >> "$summary" ;;
    roofline) step roofline "${ROOF_LIMIT:-150}" env PYTHONUNBUFFERED=1 torchrun --nproc_per_node 1 "$here/roofline.py"
              grep '"op"' "$logs/roofline.log" >> "$summary" ;;
    sbench) step sbench "${SBENCH_LIMIT:-300}" "$pack/bin/cuda_bench_stage" /tmp "${SBENCH_SHAPES:-32x32,128x32,512x32}" \
              "${SBENCH_DTYPES:-bf16}"
            grep -E "peak|layer|estimated|head" "$logs/sbench.log" >> "$summary" ;;
    sbench_unpinned) step sbench_unpinned "${SBENCH_LIMIT:-300}" env LFM2_GEMM_PIN=0 "$pack/bin/cuda_bench_stage" /tmp \
                       "${SBENCH_SHAPES:-32x32,128x32,512x32}" bf16
                     echo "(LFM2_GEMM_PIN=0: cuBLASLt's algorithm per row count)" >> "$summary"
                     grep -E " layer " "$logs/sbench_unpinned.log" >> "$summary" ;;
    memcheck) step memcheck "${MEMCHECK_LIMIT:-150}" compute-sanitizer --tool memcheck --error-exitcode 9 \
                "$pack/bin/cuda_ops_test" --gtest_filter="${MEMCHECK_FILTER:-CudaGrouped/bf16.Gather*:CudaOps/bf16.MoeExperts:CudaGrouped/fp16.RowsBit*}"
              grep -E "ERROR SUMMARY|PASSED|FAILED" "$logs/memcheck.log" | tail -5 >> "$summary" ;;
    racecheck) step racecheck "${RACECHECK_LIMIT:-150}" compute-sanitizer --tool racecheck --error-exitcode 9 \
                "$pack/bin/cuda_ops_test" --gtest_filter="${RACECHECK_FILTER:-CudaOps/bf16.Attention}"
              grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard|PASSED|FAILED" "$logs/racecheck.log" | tail -5 >> "$summary" ;;
    *) echo "unknown step $s" >> "$summary" ;;
  esac
done
tar czf "$out/logs.tar.gz" -C "$out" logs && rm -rf "$logs"
cat "$summary"
