#!/usr/bin/env bash
# launch/gpu-compare.sh OLD_SRC NEW_SRC: two source trees of lfm2-rank (e.g. two commits, unpacked
# with `git archive`) built and run on this machine's GPU in one go: the same runs on the same full-
# size model and inputs, their outputs compared bit for bit (tests/rank's `rank_test_files same`),
# their benchmark figures side by side; and NEW's GPU tests. For a change that must not change what
# the GPU computes, nor its speed (issue 25: the house before the engine grows).
#
#   OUT=/tmp/cmp launch/gpu-compare.sh .old .new
#
# Environment: OUT (logs; summary.txt last), WORK (/tmp/lfm2-compare: builds, model, inputs), JOBS
# (16), CUTLASS (a CUTLASS include dir; default: each tree's .deps or the checkout's), CTEST (1: run
# NEW's `ctest -L 'cuda|gpu'`), N x S (1024 x 32: scoring), GEN ("64:32:32": batch, prompt, new
# tokens), BENCH_GEN ("256:32:32"), REPEAT (5). Needs a CUDA GPU, nvcc, MPI, HDF5, python3 + h5py.
set -uo pipefail
old_src=$(cd "${1:?OLD_SRC}" && pwd)
new_src=$(cd "${2:?NEW_SRC}" && pwd)
here=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-./gpu-compare-out}
WORK=${WORK:-/tmp/lfm2-compare}
JOBS=${JOBS:-16}
N=${N:-1024} S=${S:-32} GEN=${GEN:-64:32:32} BENCH_GEN=${BENCH_GEN:-256:32:32} REPEAT=${REPEAT:-5}
mkdir -p "$OUT" "$WORK"
OUT=$(cd "$OUT" && pwd)
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
T0=$SECONDS
say() { printf '[%4d s] %s\n' $((SECONDS - T0)) "$*" | tee -a "$SUMMARY"; }
export NCCL_NVLS_ENABLE=0 OMPI_MCA_btl_vader_single_copy_mechanism=none
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
MPI=(mpirun -np 1 --bind-to none)
[ "$(id -u)" -eq 0 ] && MPI+=(--allow-run-as-root)
cutlass_of() {  # the CUTLASS headers for a tree: $CUTLASS, its .deps, or the checkout's
  for d in "${CUTLASS:-}" "$1/.deps/cutlass-4.2.0" "$here/.deps/cutlass-4.2.0"; do
    [ -n "$d" ] && [ -d "$d/include" ] && { echo "$d"; return; }
  done
}

build() {  # build NAME SRC TARGETS...
  local name=$1 src=$2
  shift 2
  local dir=$WORK/build-$name
  cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DLFM2_CUTLASS_DIR="$(cutlass_of "$src")" >"$OUT/build-$name.log" 2>&1 &&
    ninja -C "$dir" -j "$JOBS" "$@" >>"$OUT/build-$name.log" 2>&1
  local rc=$?
  say "build $name: exit $rc"
  [ $rc -eq 0 ] || tail -20 "$OUT/build-$name.log"
  return $rc
}
build old "$old_src" lfm2-rank || exit 1
if [ "${CTEST:-1}" = 1 ]; then build new "$new_src" || exit 1; else build new "$new_src" lfm2-rank h5pack rank_test_files || exit 1; fi
OLD=$WORK/build-old/src/rank/lfm2-rank
NEW=$(find "$WORK/build-new/src/rank" -name lfm2-rank -type f | head -1)
H5PACK=$WORK/build-new/src/h5pack/h5pack
SAME=$(find "$WORK/build-new/tests" -name rank_test_files -type f | head -1)

# ---- the model and inputs (NEW's h5pack; both trees read the same format)
MODEL=$WORK/lfm2-8b-a1b.h5
[ -f "$MODEL" ] || "$H5PACK" -q synth "$MODEL" --preset lfm2-8b-a1b --seed 0 --dtype bf16 >"$OUT/data.log" 2>&1
IFS=: read -r gb gs gk <<<"$GEN"
IFS=: read -r bb bs bk <<<"$BENCH_GEN"
python3 - "$MODEL" "$WORK" "$N" "$S" "$gb" "$gs" "$bb" "$bs" >>"$OUT/data.log" 2>&1 <<'EOF'
import json, sys
import h5py, numpy as np
model, work, n, s, gb, gs, bb, bs = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
v = json.loads(h5py.File(model, "r").attrs["config_json"])["vocab_size"]
rng = np.random.default_rng(7)
for name, (rows, cols) in {"score": (n, s), "gen": (gb, gs), "bench": (bb, bs)}.items():
    with h5py.File(f"{work}/in-{name}.h5", "w") as f:
        f["input_ids"] = rng.integers(0, v, (rows, cols), dtype=np.int32)
EOF
say "model and inputs: $(ls "$MODEL" "$WORK"/in-*.h5 2>/dev/null | wc -l) files"

# ---- the same runs with both builds
run() {  # run TAG BIN LOG options...
  local tag=$1 bin=$2 log=$3
  shift 3
  { echo "=== $tag: $*"; timeout -k 10 300 "${MPI[@]}" "$bin" --device cuda --model "$MODEL" --timeout 120 "$@"
    echo "=== $tag: exit $?"; } >>"$OUT/$log" 2>&1
}
for b in old new; do
  bin=$OLD; [ $b = new ] && bin=$NEW
  run "$b score" "$bin" runs-$b.log --inputs "$WORK/in-score.h5" --dtype bf16 --output "$WORK/score-$b.h5"
  run "$b generate" "$bin" runs-$b.log --inputs "$WORK/in-gen.h5" --dtype bf16 --max-new-tokens "$gk" \
    --output "$WORK/gen-$b.h5"
  run "$b generate sampled" "$bin" runs-$b.log --inputs "$WORK/in-gen.h5" --dtype bf16 --max-new-tokens "$gk" \
    --temperature 0.8 --top-k 50 --seed 3 --output "$WORK/sample-$b.h5"
done
for what in score gen sample; do
  say "bits $what: $("$SAME" same "$WORK/$what-old.h5" "$WORK/$what-new.h5" 2>&1 | tail -1)"
done

# ---- speed, alternating old and new so that drift hits both
for i in 1 2; do
  for b in old new; do
    bin=$OLD; [ $b = new ] && bin=$NEW
    run "$b bench score $i" "$bin" bench-$b.log --inputs "$WORK/in-score.h5" --dtype bf16 --benchmark --warmup 1 \
      --repeat "$REPEAT"
    run "$b bench generate $i" "$bin" bench-$b.log --inputs "$WORK/in-bench.h5" --dtype bf16 --max-new-tokens "$bk" \
      --benchmark --warmup 1 --repeat 2
  done
done
for b in old new; do
  say "$b scoring: $(grep -o 'benchmark: [0-9.]* samples/s' "$OUT/bench-$b.log" | sed 's/benchmark: //' | tr '\n' ' ')"
  say "$b generation: $(grep -o 'benchmark: generation of .*tokens/s' "$OUT/bench-$b.log" | sed 's/.*: //' | tr '\n' ' ')"
  say "$b decode: $(grep -o 'decode [0-9.]* s for [0-9]* tokens: [0-9.]* tokens/s' "$OUT/bench-$b.log" | sed 's/.*: //' | tr '\n' ' ')"
done

# ---- NEW's GPU tests
if [ "${CTEST:-1}" = 1 ]; then
  (cd "$WORK/build-new" && timeout -k 10 400 ctest -L 'cuda|gpu' -j 8 --output-on-failure --timeout 240) \
    >"$OUT/ctest.log" 2>&1
  say "ctest -L 'cuda|gpu' (new): exit $?: $(grep -E 'tests passed|tests failed' "$OUT/ctest.log" | tail -1)"
  grep -E '\((Failed|Timeout)\)' "$OUT/ctest.log" | sed 's/^/ctest: /' | tee -a "$SUMMARY"
fi
say "done"
