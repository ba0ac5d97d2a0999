#!/usr/bin/env bash
# gpu_run.sh GPU_COUNT NEED pass|fail SECONDS REGEX COMMAND...: the GPU end-to-end tests of lfm2-rank.
# Exits 77 (ctest: skipped) when fewer than NEED GPUs are visible (GPU_COUNT is the gpu_count
# helper); otherwise `pass` requires COMMAND to exit 0 within SECONDS with output matching the
# extended REGEX, and `fail` hands over to expect_fail.sh (nonzero exit, output matching REGEX).
set -u
count_exe=$1 need=$2 mode=$3 limit=$4 regex=$5
shift 5
have=$("$count_exe" 2>/dev/null || echo 0)
if [ "${have:-0}" -lt "$need" ]; then
  echo "gpu_run: skipped: $have GPU(s) visible, this test needs $need"
  exit 77
fi
if [ "$mode" = fail ]; then exec "$(dirname "$0")/expect_fail.sh" "$limit" "$regex" "$@"; fi
out=$(timeout --kill-after=5 "$limit" "$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -ne 0 ]; then echo "gpu_run: exit $rc"; exit 1; fi
if ! printf '%s\n' "$out" | tr '\n' ' ' | grep -Eq -- "$regex"; then echo "gpu_run: no match for /$regex/"; exit 1; fi
echo "gpu_run: exit 0, matched /$regex/"
