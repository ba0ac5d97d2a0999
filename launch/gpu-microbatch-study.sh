#!/usr/bin/env bash
# launch/gpu-microbatch-study.sh: fp32 on 4 GPUs at several microbatch sizes — are the outputs
# bit-identical across microbatch sizes, and are the sequences past the logit tolerance the ones
# whose expert routing is closest to a tie? Run after launch/gpu-check.sh made $WORK's model,
# inputs and answers (same defaults). Logs: $OUT/study.log.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-./gpu-check-out}; WORK=${WORK:-/tmp/lfm2-gpu-check}; BUILD_DIR=${BUILD_DIR:-$here/build-gpu}
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUT"
flags=(--bind-to none); [ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
{
  for mb in ${MICROBATCHES:-32 64 128}; do
    echo "=== fp32 microbatch $mb"
    mpirun -np 4 "${flags[@]}" "$BUILD_DIR/src/rank/lfm2-rank" --device cuda --dtype fp32 --microbatch "$mb" \
      --model "$WORK/lfm2-8b-a1b.h5" --inputs "$WORK/inputs-1024x32.h5" --answers "$WORK/answers-1024x32.h5" \
      --output "$WORK/out-fp32-mb$mb.h5" --timeout 120 2>&1 | grep -E 'validation|error'
  done
  python3 - "$WORK" ${MICROBATCHES:-32 64 128} <<'PY'
import sys, h5py, numpy as np
work, mbs = sys.argv[1], sys.argv[2:]
ans = h5py.File(f"{work}/answers-1024x32.h5", "r")
ref, gap = ans["logits"][()], ans["router_gap"][()] if "router_gap" in ans else None
outs = {mb: h5py.File(f"{work}/out-fp32-mb{mb}.h5", "r")["logits"][()] for mb in mbs}
for a in mbs:
    for b in mbs:
        if a < b:
            d = np.abs(outs[a] - outs[b]).max(axis=1)
            print(f"mb{a} vs mb{b}: bit-identical rows {int((d == 0).sum())}/{len(d)}, max |diff| {d.max():.3g}")
for mb, lg in outs.items():
    err = np.abs(lg - ref).max(axis=1)
    worst = np.argsort(-err)[:6]
    print(f"mb{mb}: per-sequence max|dlogit| median {np.median(err):.3g}, 99th pct {np.percentile(err, 99):.3g}; worst:",
          ", ".join(f"seq {i} err {err[i]:.3g}" + (f" router gap {gap[i]:.2e}" if gap is not None else "") for i in worst))
if gap is not None:
    print(f"router gap over all sequences: median {np.median(gap):.2e}, 1st pct {np.percentile(gap, 1):.2e}")
PY
} 2>&1 | tee "$OUT/study.log"
