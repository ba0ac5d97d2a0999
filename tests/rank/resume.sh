#!/usr/bin/env bash
# resume.sh SAME BATCH DIR NAME KILL_RANK COMMAND...: a continuous generation job (COMMAND, without
# --output) run whole, then again with rank KILL_RANK killed (SIGKILL) half way through its steps,
# then resumed (--resume): the resumed output equals the whole run's bit for bit (SAME: rank_test_files
# same), the killed run left its journal and a partial output (and no output), and at most 5% of the
# work was done again (BATCH: batch_test_files redone, counted in replica 0's steps; with replicas,
# REDONE=skip: the other replicas work on until mpirun stops them, which replica 0's steps do not
# count).
set -uo pipefail
source "$(dirname "$0")/resume_steps.sh"
same=$1 batch=$2 dir=$3 name=$4 kill_rank=$5
shift 5
full=$dir/${name}_full.h5 out=$dir/${name}.h5
rm -f "$full" "$out" "$out.journal" "$out.partial"
whole_run resume "$dir/${name}_full.log" "$full" "$@" || exit 1
steps=$(sed -n 's/.*continuous: \([0-9]*\) steps.*/\1/p' "$dir/${name}_full.log" | head -1)
kill=$((steps / 2))
echo "resume: the whole run took $steps steps; killing rank $kill_rank after its item $kill"
if LFM2_TEST_KILL="$kill_rank:$kill" "$@" --output "$out" >"$dir/${name}_killed.log" 2>&1; then
  echo "resume: the killed run exited 0"; exit 1
fi
stopped_state resume "$out" || exit 1
resume_run resume "$dir/${name}_resumed.log" "$out" "$full" "$same" "$@" || exit 1
if [ "${REDONE:-}" = skip ]; then echo "resume: the share redone is not counted with replicas"; exit 0; fi
"$batch" redone "$dir/${name}_full.log" "$kill" "$dir/${name}_resumed.log"
