#!/usr/bin/env bash
# resume_refused.sh EXPECT_FAIL OUT REGEX COMMAND... -- FIRST... -- SECOND...: a continuous job
# (COMMAND FIRST, without --output) killed on its fourth step leaves the journal of OUT; resuming it
# as COMMAND SECOND (another flag or file) is refused before any work in one line matching REGEX,
# and the journal stays.
set -u
expect_fail=$1 out=$2 regex=$3
shift 3
cmd=() first=() second=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do cmd+=("$1"); shift; done
shift
while [ $# -gt 0 ] && [ "$1" != "--" ]; do first+=("$1"); shift; done
shift
second=("$@")
rm -f "$out" "$out.journal" "$out.partial"
LFM2_TEST_KILL=0:3 "${cmd[@]}" "${first[@]}" --output "$out" >/dev/null 2>&1
[ -s "$out.journal" ] || { echo "resume_refused: the killed run left no journal"; exit 1; }
before=$(md5sum <"$out.journal")
"$expect_fail" 60 "$regex" "${cmd[@]}" "${second[@]}" --output "$out" --resume || exit 1
[ "$(md5sum <"$out.journal")" = "$before" ] || { echo "resume_refused: the journal changed"; exit 1; }
echo "resume_refused: the journal stayed"
