#!/usr/bin/env bash
# generate_eos.sh RANK_TEST_FILES GREEDY.h5 OUT.h5 COMMAND...: runs COMMAND with two --eos ids taken
# from greedy generation (eos-pick: sequence 0 ends with the first, another sequence with the second),
# then checks OUT.h5: every sequence stops after its first token among them (n_generated counts it),
# repeats that very token after it, and matches GREEDY.h5 before; and the run reports how many decode
# steps of finished sequences left out the experts.
set -euo pipefail
tool=$1 greedy=$2 out=$3
shift 3
read -r eos1 eos2 < <("$tool" eos-pick "$greedy")
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$@" --eos "$eos1" --eos "$eos2" 2>&1 | tee "$log"
check=$("$tool" eos-check "$greedy" "$out" "$eos1" "$eos2") || { echo "$check"; exit 1; }
echo "$check"
want=$(sed -n 's/^expect: //p' <<<"$check")
grep -qF "results: $want" "$log" || { echo "generate_eos: the run did not report: $want"; exit 1; }
