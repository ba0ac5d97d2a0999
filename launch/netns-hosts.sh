#!/usr/bin/env bash
# launch/netns-hosts.sh: several "hosts" on this one machine, for multi-node runs without a cluster.
#
#   launch/netns-hosts.sh check                 # can it run here? exit 0, else the reason and exit 77
#   launch/netns-hosts.sh up DIR N [--disks]    # hosts node0 .. node<N-1>; state and hostfile in DIR
#   launch/netns-hosts.sh run DIR HOST CMD...   # CMD on HOST: its network, hostname and disk
#   launch/netns-hosts.sh mpirun DIR ARGS...    # mpirun on node0 over the hosts, TCP only
#   launch/netns-hosts.sh bytes DIR HOST        # "tx_bytes rx_bytes" of HOST's interface
#   launch/netns-hosts.sh link DIR HOST up|down # HOST's network link up or down
#   launch/netns-hosts.sh pids DIR              # what still runs on the hosts: "host pid name command"
#   launch/netns-hosts.sh down DIR              # ends what runs on them and removes them (idempotent)
#
# Each host is a Linux network namespace (named lfm2-<pid>-<host>, unique per `up`) with its own
# hostname (a UTS namespace per command), one interface `lfm2net` with 10.213.0.<i+1>/24 on a
# bridge that lives in a namespace of its own: nothing is added to this machine's own network, and
# the addresses exist only inside these namespaces. Ranks on different hosts talk over TCP through
# the bridge (so /sys/class/net/lfm2net/statistics in a host counts what crossed its link).
# --disks gives every host a private directory DIR/disk/<host>, bound (in the host's own mount
# namespace) over the one common path DIR/node: a node-local disk, as on a cluster without a shared
# filesystem. Open MPI reaches the other hosts through launch/netns-agent.sh (plm_rsh_agent).
# Inside the hosts, TCP gives up on an unanswered connection after about 13 s (net.ipv4.tcp_retries2
# = 5, a per-namespace setting) instead of the default 15 minutes, so that Open MPI's daemons notice
# a host whose link went down within seconds, as on a cluster tuned for fast failure detection
# (lfm2-rank's own --timeout, shorter, ends the ranks first; docs/pipeline.md).
# Needs root (network namespaces), iproute2 and util-linux's unshare.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
IFACE=lfm2net
SUBNET=10.213.0

die() { echo "netns-hosts: error: $*" >&2; exit 1; }
# load DIR: the state written by `up`.
load() {
  [ -f "$1/hosts.env" ] || die "$1: no emulated hosts here (run: netns-hosts.sh up $1 N)"
  # shellcheck disable=SC1091
  . "$1/hosts.env"
}
ns_of() { echo "$PREFIX-$1"; }

check() {
  local why=""
  if [ "$(id -u)" -ne 0 ]; then why="needs root to create network namespaces (uid $(id -u))"
  elif ! command -v ip >/dev/null; then why="no 'ip' command (install iproute2)"
  elif ! command -v unshare >/dev/null; then why="no 'unshare' command (util-linux)"
  elif ! command -v mpirun >/dev/null; then why="no mpirun"
  else
    # Try it: a namespace with a veth pair and a bridge, removed again.
    local ns=lfm2-probe-$$ err
    if ! err=$(ip netns add "$ns" 2>&1); then why="cannot create a network namespace: $err"
    else
      if ! err=$( { ip -n "$ns" link add probe0 type veth peer name probe1 &&
                    ip -n "$ns" link add probebr type bridge &&
                    ip netns exec "$ns" unshare --uts --mount sh -c 'hostname probe'; } 2>&1); then
        why="cannot make veth pairs, bridges or UTS/mount namespaces: $(echo "$err" | head -1)"
      fi
      ip netns del "$ns" 2>/dev/null || true
    fi
  fi
  [ -z "$why" ] && return 0
  echo "netns-hosts: cannot emulate hosts here: $why"
  exit 77
}

up() {
  local dir=$1 n=$2 disks=0
  [ "${3:-}" = "--disks" ] && disks=1
  [[ $n =~ ^[1-9]$ ]] || die "up: N must be 1 to 9, got '$n'"
  [ -e "$dir/hosts.env" ] && die "$dir: hosts are up already (netns-hosts.sh down $dir first)"
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  PREFIX=lfm2-$$-$RANDOM
  # Written first, so that `down` finds whatever part of this exists if a step below fails.
  printf 'PREFIX=%s\nN=%s\nDISKS=%s\nDIR=%s\n' "$PREFIX" "$n" "$disks" "$dir" >"$dir/hosts.env"
  trap 'echo "netns-hosts: up failed; removing what was made" >&2; down "$dir"' ERR
  local sw
  sw=$(ns_of switch)
  ip netns add "$sw"
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  : >"$dir/hostfile"
  for ((i = 0; i < n; i++)); do
    local h=node$i ns
    ns=$(ns_of "$h")
    ip netns add "$ns"
    ip -n "$sw" link add "p$i" type veth peer name "$IFACE" netns "$ns"
    ip -n "$sw" link set "p$i" master br0 up
    ip -n "$ns" addr add "$SUBNET.$((i + 1))/24" dev "$IFACE"
    ip -n "$ns" link set "$IFACE" up
    ip -n "$ns" link set lo up
    ip netns exec "$ns" sysctl -qw net.ipv4.tcp_retries2=5
    echo "$h slots=64" >>"$dir/hostfile"
    if [ $disks -eq 1 ]; then mkdir -p "$dir/disk/$h"; fi
  done
  [ $disks -eq 1 ] && mkdir -p "$dir/node"
  trap - ERR
  echo "netns-hosts: $n hosts up ($PREFIX-node0..$((n - 1)), $SUBNET.0/24 on $IFACE$([ $disks -eq 1 ] && echo ", node-local disks $dir/disk/<host> at $dir/node"))"
}

# run DIR HOST CMD...: in HOST's network namespace, a UTS namespace named HOST and, with disks, a
# mount namespace where DIR/node is HOST's own disk. `ip netns exec` and `unshare` exec in turn,
# so CMD replaces this script (a signal to it reaches CMD).
run() {
  local dir=$1 h=$2
  shift 2
  load "$dir"
  [[ $h =~ ^node[0-9]$ ]] && [ "${h#node}" -lt "$N" ] || die "run: no host '$h' (node0 .. node$((N - 1)))"
  if [ "$DISKS" = 1 ]; then
    exec ip netns exec "$(ns_of "$h")" unshare --uts --mount --propagation private \
      sh -c 'hostname "$0" && mount --bind "$1/disk/$0" "$1/node" && shift 2 && exec "$@"' "$h" "$DIR" _ "$@"
  fi
  exec ip netns exec "$(ns_of "$h")" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$h" "$@"
}

# mpirun on node0, the other hosts reached through the agent, every byte between ranks over TCP on
# the hosts' interface (no shared memory: btl tcp,self).
run_mpirun() {
  local dir=$1
  shift
  load "$dir"
  export NETNS_HOSTS_DIR=$DIR
  # plm rsh named outright: an installation whose defaults launch on this host only (plm isolated)
  # would otherwise see one node.
  local flags=(--hostfile "$DIR/hostfile" --mca plm rsh --mca plm_rsh_agent "$here/netns-agent.sh"
    --mca btl tcp,self --mca btl_tcp_if_include "$IFACE" --mca oob_tcp_if_include "$IFACE")
  [ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
  run "$DIR" node0 mpirun "${flags[@]}" "$@"
}

bytes() {
  load "$1"
  ip netns exec "$(ns_of "$2")" sh -c "cat /sys/class/net/$IFACE/statistics/tx_bytes /sys/class/net/$IFACE/statistics/rx_bytes" |
    paste -sd' '
}

link() {
  load "$1"
  [ "$3" = up ] || [ "$3" = down ] || die "link: up or down, not '$3'"
  ip -n "$(ns_of "$2")" link set "$IFACE" "$3"
}

pids() {
  load "$1"
  local h
  for ((i = 0; i < N; i++)); do
    for p in $(ip netns pids "$(ns_of "node$i")" 2>/dev/null); do
      echo "node$i $p $(cat /proc/"$p"/comm 2>/dev/null) $(tr '\0' ' ' </proc/"$p"/cmdline 2>/dev/null | cut -c1-100)"
    done
  done
  for p in $(ip netns pids "$(ns_of switch)" 2>/dev/null); do echo "switch $p"; done
}

# down DIR: SIGKILL whatever still runs in the namespaces (they are this run's own), remove them.
down() {
  local dir=$1
  [ -f "$dir/hosts.env" ] || return 0
  load "$dir"
  local names=(switch) left
  for ((i = 0; i < N; i++)); do names+=("node$i"); done
  for h in "${names[@]}"; do
    local ns
    ns=$(ns_of "$h")
    ip netns list 2>/dev/null | grep -q "^$ns\b" || continue
    for try in 1 2 3 4 5 6 7 8 9 10; do
      left=$(ip netns pids "$ns" 2>/dev/null || true)
      [ -z "$left" ] && break
      # shellcheck disable=SC2086
      kill -KILL $left 2>/dev/null || true
      sleep 0.2
    done
    ip netns del "$ns" 2>/dev/null || echo "netns-hosts: warning: could not remove namespace $ns" >&2
  done
  rm -f "$DIR/hosts.env"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  check) check ;;
  up) [ $# -ge 2 ] || die "usage: up DIR N [--disks]"; up "$@" ;;
  run) [ $# -ge 3 ] || die "usage: run DIR HOST CMD..."; run "$@" ;;
  mpirun) [ $# -ge 1 ] || die "usage: mpirun DIR ARGS..."; run_mpirun "$@" ;;
  bytes) [ $# -eq 2 ] || die "usage: bytes DIR HOST"; bytes "$@" ;;
  link) [ $# -eq 3 ] || die "usage: link DIR HOST up|down"; link "$@" ;;
  pids) [ $# -eq 1 ] || die "usage: pids DIR"; pids "$@" ;;
  down) [ $# -eq 1 ] || die "usage: down DIR"; down "$@" ;;
  *) sed -n '2,10p' "$0" >&2; exit 2 ;;
esac
