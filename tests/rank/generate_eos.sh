#!/usr/bin/env bash
# generate_eos.sh RANK_TEST_FILES GREEDY.h5 OUT.h5 COMMAND...: runs COMMAND with --eos set to the
# second token greedy generation gave sequence 0, then checks OUT.h5: every sequence stops after
# its first such token (n_generated counts it; the rest repeats it) and matches GREEDY.h5 before;
# and the run reports how many decode steps of finished sequences left out the experts.
set -euo pipefail
tool=$1 greedy=$2 out=$3
shift 3
eos=$("$tool" token "$greedy" 0 1)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$@" --eos "$eos" 2>&1 | tee "$log"
check=$("$tool" eos-check "$greedy" "$out" "$eos") || { echo "$check"; exit 1; }
echo "$check"
want=$(sed -n 's/^expect: //p' <<<"$check")
grep -qF "results: $want" "$log" || { echo "generate_eos: the run did not report: $want"; exit 1; }
