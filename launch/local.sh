#!/usr/bin/env bash
# launch/local.sh: runs lfm2-rank on this machine through mpirun, one rank per GPU.
#
#   launch/local.sh [-n RANKS] [--hostfile FILE] [--dry-run] [-- | lfm2-rank options...]
#
# Runs where you stand: relative paths (--model, --inputs, --output, ...) are taken from the
# current directory, as lfm2-rank itself takes them. Its own options in every form: -n 4, -n=4, -n4,
# -np 4, --ranks 4, --ranks=4, --hostfile F, --hostfile=F; everything else goes to lfm2-rank (which
# takes --x v and --x=v alike). Ranks: -n, else one per GPU (nvidia-smi -L), else 4 (CPU backend).
# Each rank picks its GPU by its node-local rank inside lfm2-rank, so no CUDA_VISIBLE_DEVICES
# juggling is needed. Adds --allow-run-as-root only when run as root and --oversubscribe when there
# are more ranks than cores; never binds ranks to single cores (the CPU backend runs threads).
# The binary: $LFM2_RANK, else an installed one beside this script's prefix (P/bin/lfm2-rank, for
# P/share/lfm2-rank/launch/local.sh or its link P/bin/lfm2-local), else build/src/rank/lfm2-rank of
# this checkout (or its newest build*/), else lfm2-rank on PATH.
# With no lfm2-rank options it runs the shipped default (data/default: recipe, inputs, answers);
# its model is generated from the recipe on first use into ${LFM2_CACHE_DIR:-${XDG_CACHE_HOME:-
# ~/.cache}/lfm2-rank}, never into the sources or the installation.
# Open MPI's banners are off (mpirun -q: a failed run ends with lfm2-rank's one error line) unless
# lfm2-rank's --verbose is given; its --quiet also silences the command line printed here.
# Examples:
#   launch/local.sh                                   # the shipped default, validated
#   launch/local.sh -n 2 --model m.h5 --inputs in.h5 --answers ans.h5 --output out.h5
#   launch/local.sh -n 8 --hostfile hosts.txt --model 'stage-%d.h5' --inputs in.h5
#   launch/local.sh -n 2 --model m.h5 --prompts chat.jsonl --results out.jsonl   # text in, text out
set -euo pipefail
me=launch/local.sh
die() { echo "$me: error: $*" >&2; exit 1; }
here=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)  # the checkout, or P/share/lfm2-rank
ranks="" rflag=-n hostfile="" dry=0
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    -n|-np|--ranks) [ $# -ge 2 ] || die "$1 needs a number of ranks"; rflag=$1 ranks=$2; shift 2 ;;
    -n=*|-np=*|--ranks=*) rflag=${1%%=*} ranks=${1#*=}; shift ;;
    -np[0-9]*) ranks=${1#-np}; shift ;;
    -n[0-9]*) ranks=${1#-n}; shift ;;
    --hostfile) [ $# -ge 2 ] || die "--hostfile needs a file"; hostfile=$2; shift 2 ;;
    --hostfile=*) hostfile=${1#*=}; shift ;;
    --dry-run) dry=1; shift ;;
    --) shift; args+=("$@"); break ;;
    *) args+=("$1"); shift ;;
  esac
done
if [ -n "$ranks" ]; then
  [[ $ranks =~ ^[0-9]+$ ]] && [ "$ranks" -ge 1 ] && [ "${#ranks}" -le 6 ] || die "$rflag: '$ranks' is not a number of ranks >= 1"
fi
if [ -n "$hostfile" ]; then
  [ -f "$hostfile" ] || die "--hostfile $hostfile: no such file"
fi

# The binary, then h5pack beside it (installed: the same directory; a build: ../h5pack/h5pack).
exe=${LFM2_RANK:-}
if [ -z "$exe" ]; then
  for c in "$here/../../bin/lfm2-rank" "$here/build/src/rank/lfm2-rank" $(ls -t "$here"/build*/src/rank/lfm2-rank 2>/dev/null) \
           "$(command -v lfm2-rank || true)"; do
    if [ -n "$c" ] && [ -x "$c" ] && [ -f "$c" ]; then exe=$c; break; fi
  done
fi
[ -n "$exe" ] && [ -x "$exe" ] ||
  die "lfm2-rank not built (cmake -S . -B build -G Ninja && ninja -C build lfm2-rank), or set LFM2_RANK"

if [ -z "$ranks" ]; then
  gpus=0
  if command -v nvidia-smi >/dev/null 2>&1; then gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); fi
  ranks=$(( gpus > 0 ? gpus : 4 ))
fi

# The shipped default (no lfm2-rank options): its model from the recipe, once, into the cache.
if [ ${#args[@]} -eq 0 ]; then
  data=$here/data/default
  recipe=$data/recipe.json
  [ -f "$recipe" ] || die "$recipe: the shipped default's recipe is missing; give --model and --inputs"
  field() { sed -n "s/.*\"$1\": *\"\{0,1\}\([^\",]*\)\"\{0,1\}.*/\1/p" "$recipe" | head -1; }
  preset=$(field preset) seed=$(field seed) dtype=$(field dtype)
  [ -n "$preset" ] && [ -n "$seed" ] && [ -n "$dtype" ] || die "$recipe: no preset, seed or dtype"
  cache=${LFM2_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lfm2-rank}
  model=$cache/default/$preset-seed$seed-$dtype.h5
  if [ ! -f "$model" ]; then
    h5pack=${LFM2_H5PACK:-}
    for c in "$(dirname "$exe")/h5pack" "$(dirname "$exe")/../h5pack/h5pack" "$(command -v h5pack || true)"; do
      if [ -z "$h5pack" ] && [ -n "$c" ] && [ -x "$c" ] && [ -f "$c" ]; then h5pack=$c; fi
    done
    [ -n "$h5pack" ] || die "h5pack not found beside $exe (set LFM2_H5PACK) to create the default model"
    mkdir -p "$(dirname "$model")" || die "cannot create the cache directory $(dirname "$model")"
    echo "$me: creating the default model (once): $h5pack synth $model --preset $preset --seed $seed --dtype $dtype" >&2
    "$h5pack" -q synth "$model" --preset "$preset" --seed "$seed" --dtype "$dtype" || die "could not create $model"
  fi
  args=(--model "$model" --inputs "$data/$(field inputs)" --answers "$data/$(field answers)")
fi

# mpirun -q: no Open MPI banner after a rank's one-line error (lfm2-rank says what went wrong); its
# banners come back with lfm2-rank's --verbose. lfm2-rank's --quiet silences this script's command line.
quiet=0 verbose=0
for a in "${args[@]}"; do
  case "$a" in -q|--quiet) quiet=1 ;; -v|--verbose) verbose=1 ;; esac
done
flags=(-np "$ranks" --bind-to none)
[ "$verbose" -eq 1 ] || flags+=(-q)
[ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
[ -n "$hostfile" ] && flags+=(--hostfile "$hostfile")
if [ -z "$hostfile" ] && [ "$ranks" -gt "$(nproc)" ]; then flags+=(--oversubscribe); fi
cmd=(mpirun "${flags[@]}" "$exe" "${args[@]}")
[ "$quiet" -eq 1 ] && [ "$dry" -eq 0 ] || echo "$me: ${cmd[*]}" >&2
[ "$dry" -eq 1 ] && exit 0
exec "${cmd[@]}"
