#!/usr/bin/env bash
# tests/multihost/resume_case.sh: continuous generation across two emulated hosts
# (launch/netns-hosts.sh) with two replicas of two stages, one replica per host: the whole run, then
# the same job with rank 3 (replica 1's last stage, on node1) killed (SIGKILL) half way through its
# steps, then --resume; the resumed output equals the whole run's bit for bit (tests/rank/resume.sh
# does the three runs and the checks). Afterwards nothing may be left running on the hosts.
#
#   resume_case.sh --work DIR --rank LFM2_RANK --same RANK_TEST_FILES --batch BATCH_TEST_FILES
#       --model FILE.h5 --inputs WORKLOAD.h5
set -euo pipefail
LFM2_SOURCE_DIR=$(cd "$(dirname "$0")/../.." && pwd)
. "$LFM2_SOURCE_DIR/tests/multihost/lib.sh"

WORK="" rank="" same="" batch="" model="" inputs=""
while [ $# -gt 0 ]; do
  case "$1" in
    --work) WORK=$2 ;; --rank) rank=$2 ;; --same) same=$2 ;; --batch) batch=$2 ;; --model) model=$2 ;;
    --inputs) inputs=$2 ;;
    *) echo "resume_case: unknown argument $1" >&2; exit 2 ;;
  esac
  shift 2
done
rm -rf "$WORK"
mkdir -p "$WORK"
hosts_up 2
# The kill hook reaches node1 through -x (set for the killed run only).
export LFM2_TEST_KILL=""
REDONE=skip "$LFM2_SOURCE_DIR/tests/rank/resume.sh" "$same" "$batch" "$WORK" across_hosts 3 \
  "$HOSTS" mpirun "$H" -np 4 --map-by ppr:2:node --bind-to none -x LFM2_TEST_KILL \
  "$rank" --device cpu --model "$model" --inputs "$inputs" --max-new-tokens 32 --max-seqs 16 --pipeline 2 \
  --timeout 30
grep -Eq "plan: replica 1: ranks 2-3 on node1" "$WORK/across_hosts_full.log" || fail "replica 1 did not run on node1"
assert_nothing_left 3
echo "resume_case: PASS"
