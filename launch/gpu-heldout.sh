#!/usr/bin/env bash
# launch/gpu-heldout.sh: greedy generation on checkpoints the tests never saw, against transformers'
# generate, on the CPU and the GPU, from the whole file and from stage files.
#
#   BUILD_DIR=/tmp/lfm2-build OUT=/tmp/out launch/gpu-heldout.sh 4242 4343 4444
#
# For each seed, tools/make_goldens.py writes a fresh checkpoint of the GPU golden case's shape
# (head_dim 16: the CUDA attention's smallest) with new weights and prompts, and transformers'
# greedy tokens (fp32, 8 new tokens per prompt); h5pack converts and splits it; lfm2-rank must
# give every token at P = 1 and 2 from the whole file and at P = 2 from stage files, fp32, with
# --device cpu and --device cuda (GPU runs skipped where fewer GPUs are visible). One line per run
# in $OUT/heldout.txt; the exit status is the number of runs that failed.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$here/build}
OUT=${OUT:-./heldout-out}
WORK=${WORK:-/tmp/lfm2-heldout}
CASE=${CASE:-gqa2_hd16_gpu}
SEEDS=${*:-4242}
RANK=$BUILD_DIR/src/rank/lfm2-rank
H5PACK=$BUILD_DIR/src/h5pack/h5pack
mkdir -p "$OUT" "$WORK"
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
MPI=(mpirun --oversubscribe --bind-to none)
[ "$(id -u)" -eq 0 ] && MPI+=(--allow-run-as-root)
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
export NCCL_NVLS_ENABLE=0
failed=0
report() { printf '%s\n' "$*" | tee -a "$OUT/heldout.txt"; }

run_one() {  # run_one SEED DEVICE NP MODEL LABEL
  local seed=$1 device=$2 np=$3 model=$4 label=$5 gen=$WORK/$seed/$CASE/generate.h5 out line
  if [ "$device" = cuda ] && [ "$NGPU" -lt "$np" ]; then report "seed $seed $device P=$np $label: skipped ($NGPU GPUs)"; return; fi
  out=$("${MPI[@]}" -np "$np" "$RANK" --device "$device" --dtype fp32 --timeout 60 --model "$model" --inputs "$gen" \
    --answers "$gen" --max-new-tokens 8 --microbatch 1 2>&1)
  printf '%s\n' "$out" >>"$OUT/heldout.log"
  line=$(printf '%s\n' "$out" | grep -o 'validation (generation): .*' | head -1)
  if printf '%s\n' "$out" | grep -q 'validation: PASS'; then
    report "seed $seed $device P=$np $label: PASS, $line"
  else
    report "seed $seed $device P=$np $label: FAILED, ${line:-no validation line (see heldout.log)}"
    failed=$((failed + 1))
  fi
}

for seed in $SEEDS; do
  dir=$WORK/$seed
  python3 "$here/tools/make_goldens.py" --only "$CASE" --seed "$seed" --out "$dir" >>"$OUT/heldout.log" 2>&1 ||
    { report "seed $seed: make_goldens failed (see heldout.log)"; failed=$((failed + 1)); continue; }
  "$H5PACK" -q convert "$dir/$CASE" "$dir/model.h5" && "$H5PACK" -q split "$dir/model.h5" --stages 2 "$dir/stage-%d.h5" ||
    { report "seed $seed: h5pack failed"; failed=$((failed + 1)); continue; }
  for device in cpu cuda; do
    run_one "$seed" "$device" 1 "$dir/model.h5" "whole file"
    run_one "$seed" "$device" 2 "$dir/model.h5" "whole file"
    run_one "$seed" "$device" 2 "$dir/stage-%d.h5" "stage files"
  done
done
report "held-out: $failed run(s) failed"
exit "$failed"
