#!/usr/bin/env bash
# tests/multihost/sweep.sh WORK: the multi-host fixture's cleanup. Every case removes its own hosts
# when it exits; hosts still listed under WORK belong to a case that was killed (a ctest timeout).
# Removes them and fails, naming them, if there were any.
set -euo pipefail
hosts=$(cd "$(dirname "$0")/../../launch" && pwd)/netns-hosts.sh
found=0
for env in "${1:?usage: sweep.sh WORK}"/*/hosts/hosts.env; do
  [ -f "$env" ] || continue
  found=$((found + 1))
  echo "sweep: removing hosts left by $(dirname "$(dirname "$env")"): $(grep PREFIX "$env")"
  "$hosts" down "$(dirname "$env")"
done
[ "$found" -eq 0 ] && echo "sweep: no emulated hosts left"
[ "$found" -eq 0 ]
