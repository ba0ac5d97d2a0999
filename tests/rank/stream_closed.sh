#!/usr/bin/env bash
# stream_closed.sh SAME DIR NAME COMMAND...: a continuous generation job (COMMAND, without --output)
# run whole, then with --stream into a reader that stops after its first events (`head -c`): the job
# ends (no hang; Open MPI 4.1's mpirun aborts on the closed pipe), nonzero, with its journal and
# partial output and no output; the same command with --resume (no --stream) then gives the whole
# run's file bit for bit (SAME: rank_test_files same).
set -uo pipefail
source "$(dirname "$0")/resume_steps.sh"
same=$1 dir=$2 name=$3
shift 3
full=$dir/${name}_full.h5 out=$dir/${name}.h5
rm -f "$full" "$out" "$out.journal" "$out.partial"
whole_run stream_closed "$dir/${name}_full.log" "$full" "$@" || exit 1
"$@" --output "$out" --stream 2>"$dir/${name}_streamed.log" | head -c 20000 >"$dir/${name}_head.txt"
rc=${PIPESTATUS[0]}
echo "stream_closed: the job whose reader stopped after $(wc -c <"$dir/${name}_head.txt") bytes exited $rc"
[ "$rc" -ne 0 ] || { echo "stream_closed: it exited 0 (did the reader stop before the end?)"; exit 1; }
head -1 "$dir/${name}_head.txt" | grep -q '^{"seq": [0-9]*, "token": [0-9]*}$' ||
  { echo "stream_closed: the stream does not start with a token event"; exit 1; }
# No rank of the stopped job may live on (it would write the journal under the resumed run); the
# bracket keeps grep from finding its own command line.
for _ in $(seq 50); do
  live=$(grep -las -- "${out%.h5}[.]h5" /proc/[0-9]*/cmdline)
  [ -z "$live" ] && break
  sleep 0.2
done
[ -z "$live" ] || { echo "stream_closed: the stopped job's processes live on: $live"; exit 1; }
stopped_state stream_closed "$out" || exit 1
resume_run stream_closed "$dir/${name}_resumed.log" "$out" "$full" "$same" "$@"
