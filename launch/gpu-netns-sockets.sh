#!/usr/bin/env bash
# launch/gpu-netns-sockets.sh: the GPU pipeline across two nodes of one GPU each, NCCL over its
# socket transport, against the same pipeline on one host over NVLink, in one call.
#
#   BUILD_DIR=/tmp/lfm2-build OUT=/tmp/sockets launch/gpu-netns-sockets.sh MODEL.h5 INPUTS.h5 [ANSWERS.h5]
#
# "Two nodes" are two emulated hosts (launch/netns-hosts.sh: a network namespace and hostname
# each, a veth pair on a bridge): host nodeH sees only GPU H (CUDA_VISIBLE_DEVICES), and NCCL may
# use neither peer-to-peer nor shared memory, only TCP sockets on the hosts' interface
# (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket NCCL_SOCKET_IFNAME=lfm2net
# NCCL_IB_DISABLE=1). Where namespaces are not allowed (not root, a container without them) both
# ranks run on this host with the same NCCL settings over loopback (NCCL_SOCKET_IFNAME=lo); the
# first line says which (OVER=netns or OVER=loopback insists on one). Then the same runs on this
# host with NCCL's defaults (NVLink where the GPUs have it). NCCL_NVLS_ENABLE=0 throughout, as in
# launch/gpu-bench.sh.
#
# Runs (2 ranks, one pipeline of 2 stages): for each microbatch in MICROBATCHES (default
# "128 256"), `--dtype bf16 --benchmark --warmup 1 --repeat $REPEAT` on both transports; with
# ANSWERS also `--dtype fp32 --answers` on both (validation: PASS expected). NCCL_DEBUG=INFO shows
# which transport each channel took ("via NET/Socket" or "via P2P"): its count is printed per run,
# and across namespaces the bytes that crossed node0's interface. Logs in $OUT (run.log, summary.txt).
# The hosts are removed on exit, whatever happens (EXIT/INT/TERM trap). Needs 2 GPUs, mpirun,
# $BUILD_DIR/src/rank/lfm2-rank built with CUDA.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ $# -ge 2 ] || { sed -n '2,23p' "$0" >&2; exit 2; }
MODEL=$(realpath "$1") INPUTS=$(realpath "$2") ANSWERS=${3:+$(realpath "$3")}
BUILD_DIR=${BUILD_DIR:-/tmp/lfm2-build}
OUT=${OUT:-./gpu-sockets-out}
MICROBATCHES=${MICROBATCHES:-128 256}
REPEAT=${REPEAT:-3}
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-240}
RANK=$BUILD_DIR/src/rank/lfm2-rank
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
say() { printf '%s\n' "$*" | tee -a "$SUMMARY"; }
[ -x "$RANK" ] || { say "gpu-netns-sockets: error: no $RANK (build with CUDA first)"; exit 1; }
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "$NGPU" -ge 2 ] || { say "gpu-netns-sockets: error: needs 2 GPUs, found $NGPU"; exit 1; }

export NCCL_NVLS_ENABLE=0 NCCL_DEBUG=INFO
export OMPI_MCA_btl_vader_single_copy_mechanism=none
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
SOCKETS=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket NCCL_IB_DISABLE=1)

# ---- the two hosts, or loopback.
H=$(mktemp -d /tmp/lfm2-gpu-hosts.XXXXXX)
cleanup() { "$here/netns-hosts.sh" down "$H/hosts" >/dev/null 2>&1; rm -rf "$H"; }
trap cleanup EXIT
CHILD=""
trap '[ -n "$CHILD" ] && kill "$CHILD" 2>/dev/null; exit 130' INT TERM
why="OVER=loopback"
if [ "${OVER:-auto}" != loopback ] && why=$("$here/netns-hosts.sh" check 2>&1) && "$here/netns-hosts.sh" up "$H/hosts" 2 >/dev/null; then
  MODE=netns
  say "gpu-netns-sockets: sockets across 2 emulated hosts (node0: GPU 0, node1: GPU 1; NCCL_SOCKET_IFNAME=lfm2net)"
else
  [ "${OVER:-auto}" = netns ] && { say "gpu-netns-sockets: error: OVER=netns, but no emulated hosts here: $why"; exit 1; }
  MODE=loopback
  say "gpu-netns-sockets: namespaces not available here (${why:-netns-hosts.sh up failed}); sockets over loopback on one host (NCCL_SOCKET_IFNAME=lo)"
fi
say "gpu-netns-sockets: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), commit $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo ?), $NGPU GPUs: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"

# The per-host GPU: each host's one rank sees only the GPU numbered like its host (node1: GPU 1).
BY_HOST='h=$(hostname); CUDA_VISIBLE_DEVICES=${h#node} exec "$0" "$@"'

ROWS=()
one_run() {  # one_run NAME sockets|nvlink ARGS...
  local name=$1 how=$2
  shift 2
  local args=(--device cuda --model "$MODEL" --inputs "$INPUTS" --timeout 120 "$@") cmd=()
  if [ "$how" = nvlink ]; then
    cmd=(mpirun -np 2 --bind-to none "$RANK" "${args[@]}")
  elif [ $MODE = netns ]; then
    cmd=("$here/netns-hosts.sh" mpirun "$H/hosts" -np 2 --map-by ppr:1:node --bind-to none)
    for e in "${SOCKETS[@]}" NCCL_SOCKET_IFNAME=lfm2net NCCL_NVLS_ENABLE=0 NCCL_DEBUG=INFO; do cmd+=(-x "$e"); done
    cmd+=(sh -c "$BY_HOST" "$RANK" "${args[@]}")
  else
    cmd=(env "${SOCKETS[@]}" NCCL_SOCKET_IFNAME=lo mpirun -np 2 --bind-to none "$RANK" "${args[@]}")
  fi
  local before="" after="" t=$SECONDS
  [ "$how" = sockets ] && [ $MODE = netns ] && before=$("$here/netns-hosts.sh" bytes "$H/hosts" node0)
  # In the background, so that INT/TERM reach the trap at once (it ends the run, then the hosts).
  {
    echo "=== $name: ${cmd[*]}"
    timeout -k 10 "$RUN_TIMEOUT_S" "${cmd[@]}" &
    CHILD=$!
    wait "$CHILD"
    echo "=== $name: exit $? in $((SECONDS - t)) s"
    CHILD=""
  } >"$OUT/tmp.log" 2>&1
  [ -n "$before" ] && after=$("$here/netns-hosts.sh" bytes "$H/hosts" node0)
  cat "$OUT/tmp.log" >>"$OUT/run.log"
  local rc sps valid via crossed=""
  rc=$(sed -n "s/^=== $name: exit \([0-9]*\) in.*/\1/p" "$OUT/tmp.log")
  sps=$(grep -o 'benchmark: [0-9.]* samples/s' "$OUT/tmp.log" | head -1 | grep -o '[0-9.]*' | head -1)
  valid=$(grep -o 'validation: \(PASS\|FAIL\)' "$OUT/tmp.log" | head -1 | sed 's/validation: //')
  via=$(grep -o 'via [A-Za-z0-9/_]*' "$OUT/tmp.log" | sort | uniq -c | awk '{printf "%s%s x%s", s, $3, $1; s=", "}')
  if [ -n "$after" ]; then
    read -r tx0 rx0 <<<"$before"
    read -r tx1 rx1 <<<"$after"
    crossed="; node0's link: $(((tx1 - tx0) / 1000000)) MB out, $(((rx1 - rx0) / 1000000)) MB in"
  fi
  ROWS+=("$(printf '%-28s %4s  %-10s %-6s %s' "$name" "${rc:-?}" "${sps:--}" "${valid:--}" "${via:--}")")
  say "$name: exit ${rc:-?}, ${sps:-no} samples/s, validation ${valid:--}, channels ${via:-?}$crossed"
  grep -E 'error|start-up:|read .* of weights' "$OUT/tmp.log" | head -4 | sed "s/^/$name: /" | tee -a "$SUMMARY"
  rm -f "$OUT/tmp.log"
}

for mb in $MICROBATCHES; do
  for how in sockets nvlink; do
    one_run "$how-bf16-mb$mb" "$how" --dtype bf16 --microbatch "$mb" --benchmark --warmup 1 --repeat "$REPEAT"
  done
done
if [ -n "$ANSWERS" ]; then
  for how in sockets nvlink; do one_run "$how-fp32-validate" "$how" --dtype fp32 --microbatch 128 --answers "$ANSWERS"; done
fi

say ""
say "summary ($MODE; logs in $OUT):"
say "$(printf '%-28s %4s  %-10s %-6s %s' run exit samples/s valid 'NCCL channels')"
for r in "${ROWS[@]}"; do say "$r"; done
