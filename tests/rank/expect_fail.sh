#!/usr/bin/env bash
# expect_fail.sh SECONDS REGEX COMMAND...: passes when COMMAND exits nonzero within SECONDS and its
# output (stdout and stderr) matches the extended REGEX. Used by the lfm2-rank failure tests.
set -u
limit=$1 regex=$2
shift 2
out=$(timeout --kill-after=5 "$limit" "$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -eq 0 ]; then echo "expect_fail: the command succeeded"; exit 1; fi
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && ! printf '%s' "$out" | grep -q "signal 9"; then
  echo "expect_fail: still running after $limit s"; exit 1
fi
if ! printf '%s\n' "$out" | grep -Eq -- "$regex"; then echo "expect_fail: no line matches /$regex/"; exit 1; fi
echo "expect_fail: exit $rc, matched /$regex/"
