#!/usr/bin/env bash
# launch/local.sh: runs lfm2-rank on this machine through mpirun, one rank per GPU.
#
#   launch/local.sh [-n RANKS] [--hostfile FILE] [--dry-run] [-- | lfm2-rank options...]
#
# Ranks: -n, else one per GPU (nvidia-smi -L), else 4 (CPU backend). Each rank picks its GPU by its
# node-local rank inside lfm2-rank, so no CUDA_VISIBLE_DEVICES juggling is needed. Adds
# --allow-run-as-root only when run as root and --oversubscribe when there are more ranks than
# cores; never binds ranks to single cores (the CPU backend runs threads in each rank).
# The binary: $LFM2_RANK, else build/src/rank/lfm2-rank (or the newest build*/ that has one).
# Examples:
#   launch/local.sh                                   # the shipped default, validated (its model is
#                                                     # created from data/default/recipe.json if missing)
#   launch/local.sh -n 2 --model m.h5 --inputs in.h5 --answers ans.h5 --output out.h5
#   launch/local.sh -n 8 --hostfile hosts.txt --model 'stage-%d.h5' --inputs in.h5
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
ranks="" hostfile="" dry=0
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    -n|--ranks) ranks=$2; shift 2 ;;
    --hostfile) hostfile=$2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    --) shift; args+=("$@"); break ;;
    *) args+=("$1"); shift ;;
  esac
done

exe=${LFM2_RANK:-}
if [ -z "$exe" ]; then
  for c in "$here/build/src/rank/lfm2-rank" $(ls -t "$here"/build*/src/rank/lfm2-rank 2>/dev/null); do
    if [ -x "$c" ]; then exe=$c; break; fi
  done
fi
if [ -z "$exe" ] || [ ! -x "$exe" ]; then
  echo "launch/local.sh: error: lfm2-rank not built (cmake -S . -B build -G Ninja && ninja -C build lfm2-rank), or set LFM2_RANK" >&2
  exit 1
fi

if [ -z "$ranks" ]; then
  gpus=0
  if command -v nvidia-smi >/dev/null 2>&1; then gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); fi
  ranks=$(( gpus > 0 ? gpus : 4 ))
fi

# The shipped default (no options): create its model from the recipe on first use.
if [ ${#args[@]} -eq 0 ] && [ ! -f "$here/data/default/model.h5" ]; then
  h5pack="$(dirname "$exe")/../h5pack/h5pack"
  create=$(sed -n 's/.*"create_model": *"\(.*\)".*/\1/p' "$here/data/default/recipe.json")
  [ -x "$h5pack" ] && [ -n "$create" ] || { echo "launch/local.sh: error: cannot create data/default/model.h5 ($create)" >&2; exit 1; }
  echo "launch/local.sh: creating the default model: $create" >&2
  (cd "$here" && "$h5pack" ${create#h5pack })
fi

flags=(-np "$ranks" --bind-to none)
[ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
[ -n "$hostfile" ] && flags+=(--hostfile "$hostfile")
if [ -z "$hostfile" ] && [ "$ranks" -gt "$(nproc)" ]; then flags+=(--oversubscribe); fi
# The default lives under data/: run from the repository root so relative paths there resolve.
cd "$here"
cmd=(mpirun "${flags[@]}" "$exe" "${args[@]}")
echo "launch/local.sh: ${cmd[*]}" >&2
[ "$dry" -eq 1 ] && exit 0
exec "${cmd[@]}"
