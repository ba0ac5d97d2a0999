#!/usr/bin/env bash
# launch/gpu-bench.sh: the pipeline's figures on the GPUs of one machine, in one go, beside the
# transformers peer measured in the same call.
#
#   OUT=/tmp/out launch/gpu-bench.sh                          # everything, defaults below
#   RUNS="1:bf16:128 2:bf16:64 2:bf16:128" launch/gpu-bench.sh # chosen runs only
#
# Phases (each one's log is one file under $OUT; summary.txt at the end):
#   build     cmake -G Ninja (CUDA on, sm_90), h5pack first, the rest while the model is written
#   data      in the background: h5pack synth --preset $PRESET (bf16) into $WORK, then inputs N x S
#             and fp32 answers from transformers (tools/hf_answers.py) on GPU 0        -> data.log
#   ctest     the CUDA and GPU tests (-L 'cuda|gpu')                                   -> ctest.log
#   peer      hf_peer.py (transformers, bf16, grouped_mm experts) on GPU 0              -> peer.log
#   layout    tools/plan_layout.py's R x P for this machine and the model              -> summary
#   runs      each RUNS entry P:DTYPE:MICROBATCH[:GRAPHS[:trace]] as mpirun -np P lfm2-rank
#             --benchmark (warm-up 1, repeat $REPEAT), with --trace where asked; P may be RxP
#             (R replicas of a P-stage pipeline: mpirun -np R*P ... --pipeline P)       -> runs.log
#   generate  each GEN_RUNS entry P:DTYPE:BATCH:MICROBATCH:NEW as --max-new-tokens NEW --benchmark on
#             the first BATCH prompts (time to first token, decode tokens/s); P may be RxP -> generate.log
#   validate  fp32 at P = 1 and P = all GPUs against the answers (top-1 must be N/N)    -> validate.log
# Every run is cut off at $RUN_TIMEOUT_S; runs that would start after $BUDGET_S are skipped.
# Environment: OUT, WORK (/tmp/lfm2-bench), BUILD_DIR (/tmp/lfm2-build), PRESET (lfm2-8b-a1b),
# N (1024), S (32), REPEAT (3), RUNS, SKIP_<PHASE>=1, PEER_SCRIPT (hf_peer.py; default .bench/ or
# ../shared/bench/), BUDGET_S (500), RUN_TIMEOUT_S (150), EXTRA (more lfm2-rank options for every run),
# VALIDATE_P (the rank counts validated in fp32, RxP allowed; default 1 and all GPUs).
set -uo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-./gpu-bench-out}
WORK=${WORK:-/tmp/lfm2-bench}
BUILD_DIR=${BUILD_DIR:-/tmp/lfm2-build}
PRESET=${PRESET:-lfm2-8b-a1b}
N=${N:-1024}
S=${S:-32}
REPEAT=${REPEAT:-3}
BUDGET_S=${BUDGET_S:-500}
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-150}
EXTRA=${EXTRA:-}
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "$NGPU" -ge 1 ] || NGPU=1
RUNS=${RUNS-"1:bf16:128 1:bf16:128:off 1:bf16:256:on:trace 1:bf16:512"}  # RUNS="" runs none
GEN_RUNS=${GEN_RUNS:-}
mkdir -p "$OUT" "$WORK"
OUT=$(cd "$OUT" && pwd)
SUMMARY=$OUT/summary.txt
T0=$SECONDS
export NCCL_NVLS_ENABLE=0
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
MPI_FLAGS=(--bind-to none)
[ "$(id -u)" -eq 0 ] && MPI_FLAGS+=(--allow-run-as-root)
RANK=$BUILD_DIR/src/rank/lfm2-rank
H5PACK=$BUILD_DIR/src/h5pack/h5pack
MODEL=$WORK/$PRESET.h5
INPUTS=$WORK/inputs-${N}x$S.h5
ANSWERS=$WORK/answers-${N}x$S.h5
PEER_SCRIPT=${PEER_SCRIPT:-}
for p in "$here/.bench/hf_peer.py" "$here/../shared/bench/hf_peer.py"; do
  [ -z "$PEER_SCRIPT" ] && [ -f "$p" ] && PEER_SCRIPT=$p
done

say() { printf '%s\n' "$*" | tee -a "$SUMMARY"; }
elapsed() { echo $((SECONDS - T0)); }
skip() { local v="SKIP_$1"; [ "${!v:-0}" = 1 ]; }
: >"$SUMMARY"
say "gpu-bench: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), commit $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo ?), $NGPU GPU(s)"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>&1 | sed 's/^/gpu: /' | tee -a "$SUMMARY"

# ---- build: h5pack first (the model is written while the rest compiles)
if ! skip BUILD; then
  cmake -S "$here" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLFM2_ENABLE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 >"$OUT/build.log" 2>&1 && ninja -C "$BUILD_DIR" h5pack >>"$OUT/build.log" 2>&1
  say "[$(elapsed) s] build: h5pack exit $?"
fi
make_data() {
  if [ ! -f "$MODEL.done" ]; then
    rm -f "$MODEL"
    "$H5PACK" synth "$MODEL" --preset "$PRESET" --seed 0 --dtype bf16 && touch "$MODEL.done"
  fi
  [ -f "$MODEL.done" ] || return 1
  skip HF && return 0
  [ -f "$ANSWERS.done" ] && return 0
  CUDA_VISIBLE_DEVICES=0 python3 "$here/tools/hf_answers.py" "$MODEL" "$INPUTS" "$ANSWERS" --make-inputs "${N}x$S" \
    --seed 7 --device cuda --batch 64 && touch "$ANSWERS.done"
}
data_pid=""
if ! skip DATA; then
  make_data >"$OUT/data.log" 2>&1 &
  data_pid=$!
fi
if ! skip BUILD; then
  ninja -C "$BUILD_DIR" >>"$OUT/build.log" 2>&1
  rc=$?
  say "[$(elapsed) s] build: exit $rc"
  [ $rc -eq 0 ] || { tail -30 "$OUT/build.log"; exit 1; }
fi

# ---- ctest: the GPU tests (the CPU ones ran in CI)
if ! skip CTEST; then
  (cd "$BUILD_DIR" && timeout -k 10 300 ctest -L 'cuda|gpu' -j 8 --output-on-failure --timeout 240) >"$OUT/ctest.log" 2>&1
  say "[$(elapsed) s] ctest -L 'cuda|gpu': exit $?: $(grep -E 'tests passed|tests failed' "$OUT/ctest.log" | tail -1)"
  grep -E '\((Failed|Timeout)\)' "$OUT/ctest.log" | sed 's/^/ctest: /' | tee -a "$SUMMARY"
fi

if [ -n "$data_pid" ]; then
  wait "$data_pid"
  say "[$(elapsed) s] data: exit $?: model $([ -f "$MODEL.done" ] && echo ready || echo MISSING), answers $([ -f "$ANSWERS.done" ] && echo ready || echo MISSING)"
fi
[ -f "$MODEL.done" ] || { say "gpu-bench: no model; stopping"; exit 1; }
if [ ! -f "$INPUTS" ]; then  # without the answers step: random ids of the model's vocabulary
  python3 -c "import h5py, numpy as np, json; v=json.loads(h5py.File('$MODEL','r').attrs['config_json'])['vocab_size']; \
h5py.File('$INPUTS','w')['input_ids']=np.random.default_rng(7).integers(0, v, ($N, $S), dtype=np.int32)" >>"$OUT/data.log" 2>&1
fi

# ---- the peer, on GPU 0, in this same call
PEER_SPS=""
if ! skip PEER && [ -n "$PEER_SCRIPT" ]; then
  (cd "$OUT" && CUDA_VISIBLE_DEVICES=0 OUT="$OUT" N=$N S=$S PEER_DTYPES=bf16 PEER_IMPLS=grouped_mm PEER_MB=${PEER_MB:-128,512} \
    PEER_DECODE=${PEER_DECODE:-0} PEER_DECODE_B=${PEER_DECODE_B:-64,256} timeout -k 10 300 python3 "$PEER_SCRIPT") >"$OUT/peer.log" 2>&1
  grep '"kind": "decode"' "$OUT/peer.log" | sed 's/^/peer decode: /' | tee -a "$SUMMARY"
  PEER_SPS=$(python3 -c "import json; r=json.load(open('$OUT/hf_peer.json')); print(max(x.get('samples_s', 0) for x in r))" 2>/dev/null)
  say "[$(elapsed) s] peer: transformers bf16 grouped_mm, best ${PEER_SPS:-?} samples/s ($(grep -o '"mb": [0-9]*, "secs": [0-9.]*, "samples_s": [0-9.]*' "$OUT/peer.log" | tr '\n' ';'))"
fi

# ---- the layout tools/plan_layout.py proposes for this machine (h5py reads the model's config)
if ! skip LAYOUT; then
  python3 "$here/tools/plan_layout.py" --model "$MODEL" --sequences "$N" --seq-len "$S" --dtype bf16 2>&1 |
    sed 's/^/layout: /' | tee -a "$SUMMARY"
fi

# "RxP" -> ranks R*P and --pipeline P; a plain P -> P ranks, one pipeline.
ranks_of() { case "$1" in *x*) echo $((${1%x*} * ${1#*x})) ;; *) echo "$1" ;; esac; }
pipeline_opt() { case "$1" in *x*) echo "--pipeline ${1#*x}" ;; esac; }

# ---- lfm2-rank runs
ROWS=()
one_run() {  # one_run NAME NP LOG options...
  local name=$1 np=$2 log=$3
  shift 3
  if [ "$(elapsed)" -ge "$BUDGET_S" ]; then say "[$(elapsed) s] skipped $name: past $BUDGET_S s"; return; fi
  local flags=("${MPI_FLAGS[@]}")
  [ "$np" -gt "$NGPU" ] && { say "skipped $name: $np ranks, $NGPU GPUs"; return; }
  local cmd=(mpirun -np "$np" "${flags[@]}" "$RANK" --device cuda --model "$MODEL" --inputs "$INPUTS" --timeout 120 "$@" $EXTRA)
  local t=$SECONDS
  { echo "=== $name: ${cmd[*]}"; timeout -k 10 "$RUN_TIMEOUT_S" "${cmd[@]}"; echo "=== $name: exit $? in $((SECONDS - t)) s"; } >"$OUT/tmp.log" 2>&1
  cat "$OUT/tmp.log" >>"$OUT/$log"
  local rc sps bubble spread busy agree
  rc=$(sed -n "s/^=== $name: exit \([0-9]*\) in.*/\1/p" "$OUT/tmp.log")
  sps=$(grep -o 'benchmark: [0-9.]* samples/s' "$OUT/tmp.log" | head -1 | sed 's/benchmark: //; s/ samples\/s//')
  bubble=$(sed -n 's/.*benchmark: bubble \([0-9.]*%\) measured.* = \([0-9.]*%\)$/\1 vs GPipe \2/p' "$OUT/tmp.log" | head -1)
  spread=$(grep -o 'busy spread [0-9.]*%' "$OUT/tmp.log" | head -1 | sed 's/busy spread //')
  busy=$(grep -o 'busy [0-9.]* s, [0-9.]*% of the wall' "$OUT/tmp.log" | sed 's/busy //; s/ s, /s=/; s/ of the wall//' | tr '\n' ' ')
  agree=$(grep -o 'top-1 agreement [0-9]*/[0-9]*' "$OUT/tmp.log" | head -1 | sed 's/top-1 agreement //')
  local ratio=""
  [ -n "$PEER_SPS" ] && [ -n "$sps" ] && ratio=$(python3 -c "print(f'{$sps / $PEER_SPS:.2f}x')")
  ROWS+=("$(printf '%-22s %2s  %5s  %-9s %-7s  %-20s %-7s %-10s %s' "$name" "$np" "${rc:-?}" "${sps:--}" "${ratio:--}" "${bubble:--}" "${spread:--}" "${agree:--}" "$busy")")
  say "[$(elapsed) s] $name: exit ${rc:-?}, ${sps:-no} samples/s (${ratio:-no peer}), ${bubble:-}, spread ${spread:--}, busy ${busy:--}"
  grep -E 'error|upload|read .* of weights' "$OUT/tmp.log" | head -4 | sed "s/^/$name: /" | tee -a "$SUMMARY"
  rm -f "$OUT/tmp.log"
}
if ! skip RUNS; then
  for r in $RUNS; do
    IFS=: read -r np dt mb graphs trace <<<"$r"
    graphs=${graphs:-on}
    name="p$np-$dt-mb$mb-graphs-$graphs"
    opts=(--dtype "$dt" --microbatch "$mb" --cuda-graphs "$graphs" --benchmark --warmup 1 --repeat "$REPEAT")
    opts+=($(pipeline_opt "$np"))
    [ "${trace:-}" = trace ] && opts+=(--trace "$OUT/trace-$name.json")
    one_run "$name" "$(ranks_of "$np")" runs.log "${opts[@]}"
    if [ "${trace:-}" = trace ] && [ -f "$OUT/trace-$name.json" ]; then
      python3 "$here/tools/trace_gantt.py" "$OUT/trace-$name.json" "$OUT/trace-$name.png" >>"$OUT/runs.log" 2>&1
    fi
  done
fi

# ---- generation benchmarks: the first BATCH prompts, NEW tokens each
for g in $GEN_RUNS; do
  IFS=: read -r np dt batch mb new <<<"$g"
  sub_inputs=$WORK/inputs-${batch}x$S.h5
  python3 -c "import h5py; h5py.File('$sub_inputs','w')['input_ids']=h5py.File('$INPUTS','r')['input_ids'][:$batch]" \
    >>"$OUT/generate.log" 2>&1
  name="gen-p$np-$dt-b$batch-mb$mb-k$new"
  [ "$(ranks_of "$np")" -gt "$NGPU" ] && { say "skipped $name: $(ranks_of "$np") ranks, $NGPU GPUs"; continue; }
  cmd=(mpirun -np "$(ranks_of "$np")" "${MPI_FLAGS[@]}" "$RANK" --device cuda --model "$MODEL" --inputs "$sub_inputs"
    --timeout 120 --dtype "$dt" --microbatch "$mb" --max-new-tokens "$new" --benchmark --warmup 1 --repeat 2
    $(pipeline_opt "$np"))
  { echo "=== $name: ${cmd[*]}"; timeout -k 10 "$RUN_TIMEOUT_S" "${cmd[@]}"; echo "=== $name: exit $?"; } >"$OUT/tmp.log" 2>&1
  cat "$OUT/tmp.log" >>"$OUT/generate.log"
  say "[$(elapsed) s] $name: $(grep -E 'exit [0-9]+$' "$OUT/tmp.log" | tail -1 | sed 's/.*exit/exit/')"
  grep -E 'benchmark: (generation|time to first|busy per stage during|decode bubble)|error' "$OUT/tmp.log" |
    sed "s/^/$name: /" | tee -a "$SUMMARY"
done

# ---- validation in fp32 against transformers' answers
if ! skip VALIDATE && [ -f "$ANSWERS.done" ]; then
  for np in ${VALIDATE_P:-1 $([ "$NGPU" -gt 1 ] && echo "$NGPU")}; do
    one_run "validate-fp32-p$np" "$(ranks_of "$np")" validate.log --dtype fp32 --answers "$ANSWERS" --microbatch 128 \
      $(pipeline_opt "$np")
  done
  one_run "validate-bf16-p$NGPU" "$NGPU" validate.log --dtype bf16 --answers "$ANSWERS"
fi

say ""
say "summary ($(elapsed) s; logs in $OUT; peer = transformers bf16 grouped_mm on GPU 0, best microbatch, ${PEER_SPS:-?} samples/s):"
say "$(printf '%-22s %2s  %5s  %-9s %-7s  %-20s %-7s %-10s %s' run P exit samples/s vs-peer 'bubble vs GPipe' spread top-1 'busy per stage')"
for r in "${ROWS[@]}"; do say "$r"; done
