#!/usr/bin/env bash
# continuous_eos.sh TOOL REF.h5 DIR NAME LAUNCH... -- RANK...: EOS ids that end sequences in the
# middle of the run (TOOL eos-pick, from REF.h5: the same run without --eos), then RANK (the runner
# and its flags, without --output; launched by LAUNCH and a count of processes: mpiexec ... -n) with
# them: the static schedule, the continuous one at P = 1 (planning one item ahead: the rows after an
# EOS are wasted), at P = 1 without look-ahead (LFM2_NO_LOOK_AHEAD=1), at P = 2, and at P = 1 with 3
# slots and a pool of 3 pages (preemption). Every output must equal the static one bit for bit, and
# stop where REF.h5 says.
set -uo pipefail
tool=$1 ref=$2 dir=$3 name=$4
shift 4
launch=()
while [ "$1" != -- ]; do launch+=("$1"); shift; done
shift
read -r eos1 eos2 < <("$tool" eos-pick "$ref") || { echo "continuous_eos: no EOS ids from $ref"; exit 1; }
echo "continuous_eos: --eos $eos1 --eos $eos2"
outs=()
run() {  # run CASE NP ENV... -- FLAGS...
  local case=$1 np=$2 env=()
  shift 2
  while [ "$1" != -- ]; do env+=("$1"); shift; done
  shift
  local out=$dir/${name}_$case.h5 log=$dir/${name}_$case.log
  rm -f "$out"
  env "${env[@]}" "${launch[@]}" "$np" "$@" --eos "$eos1" --eos "$eos2" --output "$out" >"$log" 2>&1 ||
    { cat "$log"; echo "continuous_eos: $case failed"; exit 1; }
  grep -h "continuous: " "$log" | sed "s/^/$case: /"
  outs+=("$out")
}
run static 1 -- "$@" --scheduler static
run ahead 1 -- "$@"
run no_ahead 1 LFM2_NO_LOOK_AHEAD=1 -- "$@"
[ "${SKIP_P2:-}" = 1 ] || run p2 2 -- "$@"  # SKIP_P2=1: one GPU
run preempt 1 -- "$@" --max-seqs 3 --kv-pages 3 --page-size 16 --max-batched-tokens 6
grep -q "continuous: .*([1-9][0-9]* planned ahead, [1-9][0-9]* after an EOS)" "$dir/${name}_ahead.log" ||
  { echo "continuous_eos: no row after an EOS was planned ahead"; exit 1; }
grep -q "continuous: .*(0 planned ahead, 0 after an EOS)" "$dir/${name}_no_ahead.log" ||
  { echo "continuous_eos: LFM2_NO_LOOK_AHEAD=1 planned ahead"; exit 1; }
"$tool" eos-check "$ref" "${outs[0]}" "$eos1" "$eos2" || exit 1
"$tool" same "${outs[@]}"
