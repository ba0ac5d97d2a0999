#!/usr/bin/env bash
# tests/multihost/pipeline_case.sh: the CPU pipeline across emulated hosts (launch/netns-hosts.sh).
#
#   pipeline_case.sh --hosts H --ranks P --work DIR --rank LFM2_RANK --same RANK_TEST_FILES
#       --model FILE.h5 | --stages DIR_OF_stage-r.h5   --inputs IN.h5 --answers ANS.h5
#       --reference OUT.h5 --link-bytes B
#
# P ranks, P/H per host, packed in rank order (--map-by ppr:P/H:node), every byte between ranks over
# TCP on the hosts' interfaces. The run must validate against the answers (PASS) and its outputs
# must be bit-identical to the single-host reference. Each link between consecutive ranks on two
# hosts carries all hidden states, B bytes: the sending host's tx and the receiving host's rx
# counters must grow by at least that. With --stages every host gets a node-local disk holding only
# the stage files of its own ranks (rank 0's also the inputs, the last rank's the answers and the
# output), bound over one common path, and the run reads --model '<that path>/stage-%d.h5'.
# Afterwards nothing may be left running on the hosts. Exit 77 (skip) where hosts cannot be made.
set -euo pipefail
LFM2_SOURCE_DIR=$(cd "$(dirname "$0")/../.." && pwd)
. "$LFM2_SOURCE_DIR/tests/multihost/lib.sh"

hosts="" ranks="" WORK="" rank="" same="" model="" stages="" inputs="" answers="" ref="" link_bytes=""
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts=$2 ;; --ranks) ranks=$2 ;; --work) WORK=$2 ;; --rank) rank=$2 ;; --same) same=$2 ;;
    --model) model=$2 ;; --stages) stages=$2 ;; --inputs) inputs=$2 ;; --answers) answers=$2 ;;
    --reference) ref=$2 ;; --link-bytes) link_bytes=$2 ;;
    *) echo "pipeline_case: unknown argument $1" >&2; exit 2 ;;
  esac
  shift 2
done
per_host=$((ranks / hosts))
[ $((per_host * hosts)) -eq "$ranks" ] || { echo "pipeline_case: $ranks ranks do not divide over $hosts hosts" >&2; exit 2; }
rm -rf "$WORK"
mkdir -p "$WORK"

if [ -n "$stages" ]; then
  hosts_up "$hosts" --disks
  # Node-local disks: host h holds only the files of the ranks it runs.
  for ((r = 0; r < ranks; r++)); do
    ln "$stages/stage-$r.h5" "$H/disk/node$((r / per_host))/" 2>/dev/null || cp "$stages/stage-$r.h5" "$H/disk/node$((r / per_host))/"
  done
  cp "$inputs" "$H/disk/node0/inputs.h5"
  cp "$answers" "$H/disk/node$((hosts - 1))/answers.h5"
  for ((h = 0; h < hosts; h++)); do echo "node$h's disk: $(cd "$H/disk/node$h" && ls | paste -sd' ')"; done
  files=(--model "$H/node/stage-%d.h5" --inputs "$H/node/inputs.h5" --answers "$H/node/answers.h5"
    --output "$H/node/out.h5")
  out=$H/disk/node$((hosts - 1))/out.h5
else
  hosts_up "$hosts"
  files=(--model "$model" --inputs "$inputs" --answers "$answers" --output "$WORK/out.h5")
  out=$WORK/out.h5
fi

declare -A tx0 rx0
for ((h = 0; h < hosts; h++)); do tx0[$h]=$(tx_of "node$h"); rx0[$h]=$(rx_of "node$h"); done
t0=$(now)
set +e
"$HOSTS" mpirun "$H" -np "$ranks" --map-by "ppr:$per_host:node" --bind-to none \
  "$rank" --device cpu "${files[@]}" --timeout 60 2>&1 | tee "$WORK/run.log"
rc=${PIPESTATUS[0]}
set -e
echo "pipeline_case: mpirun exit $rc after $(secs "$(ms_since "$t0")") s"
[ "$rc" -eq 0 ] || fail "the run exited $rc"
grep -q "validation: PASS" "$WORK/run.log" || fail "no 'validation: PASS'"
# The run report's start-up line names the slowest reader by rank and host.
grep -Eq "^\[rank 0\] start-up: first microbatch [0-9.]+ s after launch .* \(slowest: rank [0-9]+ on node[0-9], " \
  "$WORK/run.log" || fail "no start-up line naming a rank and its host"
assert_nothing_left 3

# Where each rank ran: the plan's node-local ranks say ranks were packed per host.
for ((r = 0; r < ranks; r++)); do
  grep -Eq "plan: rank $r \(local $((r % per_host))\)" "$WORK/run.log" || fail "rank $r is not node-local rank $((r % per_host))"
done

# The hidden states crossed the links between hosts.
for ((h = 0; h < hosts; h++)); do
  sent=$(($(tx_of "node$h") - tx0[$h])) got=$(($(rx_of "node$h") - rx0[$h]))
  want_tx=$((h < hosts - 1 ? link_bytes : 0)) want_rx=$((h > 0 ? link_bytes : 0))
  echo "node$h: sent $sent bytes (hidden states out: at least $want_tx), received $got (in: at least $want_rx)"
  [ "$sent" -ge "$want_tx" ] || fail "node$h sent $sent bytes, less than the $want_tx bytes of hidden states"
  [ "$got" -ge "$want_rx" ] || fail "node$h received $got bytes, less than the $want_rx bytes of hidden states"
done

[ -f "$out" ] || fail "no output $out"
"$same" same "$ref" "$out" || fail "the outputs differ from the single-host run's"
echo "pipeline_case: PASS ($ranks ranks over $hosts hosts$([ -n "$stages" ] && echo ", node-local stage files"))"
