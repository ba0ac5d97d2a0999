#!/usr/bin/env bash
# generate_eos.sh RANK_TEST_FILES GREEDY.h5 OUT.h5 COMMAND...: runs COMMAND with --eos set to the
# second token greedy generation gave sequence 0, then checks OUT.h5: every sequence stops after
# its first such token (n_generated counts it; the rest repeats it) and matches GREEDY.h5 before.
set -euo pipefail
tool=$1 greedy=$2 out=$3
shift 3
eos=$("$tool" token "$greedy" 0 1)
"$@" --eos "$eos"
"$tool" eos-check "$greedy" "$out" "$eos"
