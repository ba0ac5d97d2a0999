#!/usr/bin/env bash
# tests/multihost/fault_case.sh: faults across emulated hosts (launch/netns-hosts.sh).
#
#   fault_case.sh CASE --work DIR --rank LFM2_RANK --model FILE.h5 --stages DIR_OF_stage-r.h5
#       --inputs IN.h5 --timeout SECONDS
#
# CASE (4 ranks over node0 and node1, two each, unless said):
#   link-down     node1's link goes down mid-run (once a quarter of the hidden states crossed it)
#   kill-remote   rank 2, on node1, is killed after its microbatch 3
#   stop-remote   rank 2, on node1, stops (SIGSTOP) after its microbatch 3
#   stop-replica  two replicas of 2 stages (--pipeline 2), one per host; rank 3 (replica 1's last
#                 stage, the writer) stops after its microbatch 1: named with replica, stage and host
#   missing-file  3 ranks on 3 hosts with node-local disks; node2's lacks stage-2.h5
# Each must end with a nonzero exit, one line naming the rank and host at fault, no output file
# (nor a temporary one), and nothing left running on any host: every rank on every host within
# --timeout + 6 s of the fault, Open MPI's daemons (which notice a cut link only when TCP gives up on
# it) within --timeout + 25 s.
set -euo pipefail
LFM2_SOURCE_DIR=$(cd "$(dirname "$0")/../.." && pwd)
. "$LFM2_SOURCE_DIR/tests/multihost/lib.sh"

case_name=$1
shift
WORK="" rank="" model="" stages="" inputs="" timeout=5
while [ $# -gt 0 ]; do
  case "$1" in
    --work) WORK=$2 ;; --rank) rank=$2 ;; --model) model=$2 ;; --stages) stages=$2 ;; --inputs) inputs=$2 ;;
    --timeout) timeout=$2 ;;
    *) echo "fault_case: unknown argument $1" >&2; exit 2 ;;
  esac
  shift 2
done
rm -rf "$WORK"
mkdir -p "$WORK"
out=$WORK/out.h5
env_kill=()
ranks=4 per_host=2
files=(--model "$model" --inputs "$inputs" --output "$out")
case "$case_name" in
  link-down)
    hosts_up 2
    # One sequence per microbatch and one thread per rank: the run lasts long enough to be cut.
    files+=(--microbatch 1 --threads 1)
    expect_rc='^3$'
    # Rank 0 names the ranks that never finished the run (rank 1 too, when its last send to rank 2
    # was still on the way), or rank 1 the rank it cannot send to.
    expect_line="^\[rank [01]\] error: timed out after $timeout s (gathering stage times: nothing from (rank 1 on node0, )?ranks 2-3 on node1|waiting to send microbatch [0-9]+ to rank 2 on node1)"
    ;;
  kill-remote)
    hosts_up 2
    env_kill=(-x LFM2_TEST_KILL=2:3)
    files+=(--microbatch 1)
    expect_rc='^(3|137)$'
    # The killed rank cannot speak: mpirun names it (rank, node, signal).
    expect_line="process rank 2 with PID [0-9]+ on node node1 exited on signal 9"
    ;;
  stop-remote)
    hosts_up 2
    env_kill=(-x LFM2_TEST_KILL=2:3:stop)
    files+=(--microbatch 1)
    expect_rc='^3$'
    expect_line="^\[rank [0-3]\] error: timed out after $timeout s (gathering stage times: nothing from (rank 1 on node0, )?ranks 2-3 on node1|waiting to (send microbatch [0-9]+ to|receive microbatch [0-9]+ from) rank 2 on node1)"
    ;;
  stop-replica)
    hosts_up 2
    env_kill=(-x LFM2_TEST_KILL=3:1:stop)
    files+=(--microbatch 1 --pipeline 2)
    expect_rc='^3$'
    # Rank 0 names who did not finish; or replica 0's last stage, blocked sending its results to
    # the stopped writer; or rank 2, blocked sending to it.
    expect_line="^\[rank [012]\] error: timed out after $timeout s (gathering stage times: nothing from (rank 2 \(replica 1 stage 0\) on node1, )?rank 3 \(replica 1 stage 1\) on node1|sending the results of replica 0 to rank 3 on node1|waiting to send microbatch [0-9]+ to rank 3 \(replica 1 stage 1\) on node1)"
    ;;
  missing-file)
    hosts_up 3 --disks
    ranks=3 per_host=1
    ln "$stages/stage-0.h5" "$H/disk/node0/" 2>/dev/null || cp "$stages/stage-0.h5" "$H/disk/node0/"
    ln "$stages/stage-1.h5" "$H/disk/node1/" 2>/dev/null || cp "$stages/stage-1.h5" "$H/disk/node1/"
    out=$H/disk/node2/out.h5
    files=(--model "$H/node/stage-%d.h5" --inputs "$inputs" --output "$H/node/out.h5")
    expect_rc='^1$'
    expect_line="^\[rank 2\] error: $H/node/stage-2\.h5: no such file .*\(on node2\)$"
    ;;
  *) echo "fault_case: unknown case $case_name" >&2; exit 2 ;;
esac

# The job, in the background: its output to a log, its exit code to a file.
t0=$(now)
(
  set +e
  "$HOSTS" mpirun "$H" -np "$ranks" --map-by "ppr:$per_host:node" --bind-to none "${env_kill[@]}" \
    "$rank" --device cpu "${files[@]}" --timeout "$timeout" >"$WORK/run.log" 2>&1 </dev/null
  echo $? >"$WORK/rc"
) &
job=$!

# When the fault happened: the link cut here; the remote rank seen killed or stopped; else the start.
ranks_on() { "$HOSTS" pids "$H" | awk -v h="$1" '$1 == h && $3 == "lfm2-rank" {print $2}'; }
t_fault=$t0
case "$case_name" in
  link-down)
    # Mid-run: once a quarter of the hidden states (32 x 32 x 256 fp32 in all) left node0.
    base=$(tx_of node0)
    while [ $(($(tx_of node0) - base)) -lt 262144 ]; do
      [ -f "$WORK/rc" ] && fail "the run ended before the link could be cut: $(tail -3 "$WORK/run.log")"
      sleep 0.01
    done
    "$HOSTS" link "$H" node1 down
    t_fault=$(now)
    echo "fault_case: node1's link down $(secs $((t_fault - t0))) s into the run" ;;
  kill-remote | stop-remote | stop-replica)
    seen=0
    until [ -f "$WORK/rc" ]; do
      n=0 stopped=0
      for p in $(ranks_on node1); do
        n=$((n + 1))
        [ "$(ps -o stat= -p "$p" 2>/dev/null | cut -c1)" = T ] && stopped=1
      done
      [ $n -eq 2 ] && seen=1
      if [ $seen = 1 ] && { [ $stopped = 1 ] || [ $n -lt 2 ]; }; then break; fi
      sleep 0.01
    done
    t_fault=$(now)
    echo "fault_case: ${env_kill[1]#LFM2_TEST_KILL=}: seen $([ "$case_name" = kill-remote ] && echo killed || echo stopped) $(secs $((t_fault - t0))) s into the run" ;;
esac

# Bounded: every rank on every host ends within --timeout plus the ranks' stagger (at most 6 s);
# Open MPI's daemons follow once they notice a cut link, when TCP gives up on it
# (launch/netns-hosts.sh: tcp_retries2 = 5, about 15 s after the abort).
rank_limit=$((${timeout%.*} + 6)) limit=$((${timeout%.*} + 25))
took_ranks="" seen_ranks=0
while kill -0 "$job" 2>/dev/null || [ -n "$("$HOSTS" pids "$H")" ]; do
  if "$HOSTS" pids "$H" | awk '$3 == "lfm2-rank"' | grep -q .; then seen_ranks=1
  elif [ -z "$took_ranks" ] && [ $seen_ranks = 1 ]; then took_ranks=$(ms_since "$t_fault"); fi
  if [ "$(ms_since "$t_fault")" -gt $(((limit + 20) * 1000)) ]; then
    cat "$WORK/run.log"
    fail "still running $(secs "$(ms_since "$t_fault")") s after the fault:"$'\n'"$("$HOSTS" pids "$H")"
  fi
  sleep 0.05
done
took=$(ms_since "$t_fault")
took_ranks=${took_ranks:-$took}
wait "$job" || true
rc=$(cat "$WORK/rc")
cat "$WORK/run.log"
echo "fault_case: $case_name: exit $rc; after the fault every rank ended in $(secs "$took_ranks") s (allowed: $rank_limit s), everything on the hosts in $(secs "$took") s (allowed: $limit s)"

[[ $rc =~ $expect_rc ]] || fail "exit $rc, expected /$expect_rc/"
[ "$took_ranks" -le $((rank_limit * 1000)) ] || fail "the ranks took $(secs "$took_ranks") s to end, more than $rank_limit s"
[ "$took" -le $((limit * 1000)) ] || fail "the job took $(secs "$took") s to end, more than $limit s"
grep -Eq -- "$expect_line" "$WORK/run.log" || fail "no line matches /$expect_line/"
errors=$(grep -Ec '^\[rank [0-9]+\] error: ' "$WORK/run.log" || true)
if [ "$case_name" != kill-remote ]; then
  # One line, as a rule: the ranks' staggers let the best-placed one speak and mpirun end the rest.
  # On a loaded machine a second waiting rank may speak before mpirun's kill reaches it; it must
  # then name the same culprit (every error line matches the expected one).
  [ "$errors" -ge 1 ] || fail "no error line"
  stray=$(grep -E '^\[rank [0-9]+\] error: ' "$WORK/run.log" | grep -Evc -- "$expect_line" || true)
  [ "$stray" = 0 ] || fail "$stray of $errors error lines do not name the culprit (/$expect_line/)"
  [ "$errors" = 1 ] || echo "fault_case: note: $errors error lines, all naming the culprit"
fi
grep -Eq 'terminate called|Segmentation fault|core dumped|Assertion .* failed' "$WORK/run.log" && fail "a crash"
[ ! -e "$out" ] || fail "an output was written: $out"
left=$(find "$WORK" -name '*.tmp.*')
[ -z "$left" ] || fail "temporary files left: $left"
echo "fault_case: PASS ($case_name)"
