#!/usr/bin/env bash
# launch/disk-read.sh: the sequential read bandwidth of weight files from the disk, to set beside
# the start-up figures of lfm2-rank (its "start-up:" line, docs/pipeline.md) measured on the same
# machine in the same session.
#
#   launch/disk-read.sh FILE...          # each file: O_DIRECT, cold (evicted first), cached; then
#                                        # all of them at once (as one node's ranks read them)
#   launch/disk-read.sh --drop FILE...   # only evict the files from the page cache, for a cold run
#
# Reading with O_DIRECT bypasses the page cache whatever it holds; "cold" first evicts the file
# (posix_fadvise DONTNEED, through dd iflag=nocache; pages that another process holds mapped may
# stay, and `fincore` says how much did) and reads it through the cache as lfm2-rank does; "cached"
# reads it again. Blocks of 64 MiB, as the GPU weight upload stages them. No root needed; nothing
# is written. Filesystems without O_DIRECT (tmpfs) report "-" there.
set -euo pipefail
drop_only=0
if [ "${1:-}" = --drop ]; then drop_only=1; shift; fi
[ $# -gt 0 ] || { sed -n '2,10p' "$0" >&2; exit 2; }
for f in "$@"; do [ -r "$f" ] || { echo "disk-read: error: $f: cannot read it" >&2; exit 1; }; done

evict() { dd if="$1" iflag=nocache count=0 status=none; }
cached_bytes() { command -v fincore >/dev/null && fincore --bytes --noheadings --output RES "$1" 2>/dev/null | tr -d ' ' || echo "?"; }
# rate CMD...: runs a dd, prints its rate in GB/s (from its bytes and seconds), or "-" if it failed.
rate() {
  local out
  out=$(LC_ALL=C "$@" 2>&1 >/dev/null) || { echo "-"; return; }
  awk '/copied/ {for (i = 1; i <= NF; i++) if ($i == "bytes") b = $(i - 1); for (i = 1; i <= NF; i++) if ($i ~ /^s,?$/) s = $(i - 1);
       if (s > 0) printf "%.2f", b / s / 1e9}' <<<"$out"
}

if [ $drop_only = 1 ]; then
  for f in "$@"; do evict "$f"; echo "disk-read: evicted $f ($(cached_bytes "$f") bytes still cached)"; done
  exit 0
fi

echo "disk-read: $(uname -n), $(df -hT "$1" | awk 'NR == 2 {print $1 " (" $2 "), " $3 " total"}')"
for f in "$@"; do
  size=$(stat -c %s "$f")
  direct=$(rate dd if="$f" of=/dev/null bs=64M iflag=direct)
  evict "$f"
  left=$(cached_bytes "$f")
  cold=$(rate dd if="$f" of=/dev/null bs=64M)
  warm=$(rate dd if="$f" of=/dev/null bs=64M)
  echo "disk-read: $f: $((size / 1000000)) MB: O_DIRECT $direct GB/s, cold $cold GB/s ($left bytes were still cached), cached $warm GB/s"
done
if [ $# -gt 1 ]; then
  total=0
  for f in "$@"; do evict "$f"; total=$((total + $(stat -c %s "$f"))); done
  t0=$(date +%s%N)
  for f in "$@"; do dd if="$f" of=/dev/null bs=64M status=none & done
  wait
  ns=$(($(date +%s%N) - t0))
  echo "disk-read: all $# files at once, cold: $((total / 1000000)) MB in $((ns / 1000000)) ms = $(awk -v b=$total -v n=$ns 'BEGIN {printf "%.2f", b / n}') GB/s"
fi
