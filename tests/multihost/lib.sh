# tests/multihost/lib.sh: shared by the multi-host test cases (sourced, not run).
#
# hosts_up N [--disks] makes the emulated hosts (launch/netns-hosts.sh) under $WORK/hosts and
# removes them again when the case exits, however it exits; skip (77) with the reason where they
# cannot be made. Each case runs in its own $WORK, so cases may run side by side.
HOSTS=${LFM2_SOURCE_DIR:?}/launch/netns-hosts.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

fail() { echo "FAIL: $*"; exit 1; }
now() { date +%s%3N; }                          # milliseconds
ms_since() { echo $(($(now) - $1)); }
secs() { printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)); }  # milliseconds as seconds

hosts_up() {
  "$HOSTS" check || exit 77
  H=$WORK/hosts
  trap '"$HOSTS" down "$H"' EXIT
  trap 'exit 143' TERM INT
  "$HOSTS" up "$H" "$@"
}

# Processes left on the hosts once the job has ended (orted, ranks): none may outlive it by more
# than `grace` seconds.
assert_nothing_left() {
  local grace=${1:-3} t0 left
  t0=$(now)
  while left=$("$HOSTS" pids "$H") && [ -n "$left" ]; do
    if [ "$(ms_since "$t0")" -gt $((grace * 1000)) ]; then
      fail "processes left on the hosts ${grace} s after the job ended:"$'\n'"$left"
    fi
    sleep 0.1
  done
}

# tx / rx bytes of a host's interface.
tx_of() { "$HOSTS" bytes "$H" "$1" | cut -d' ' -f1; }
rx_of() { "$HOSTS" bytes "$H" "$1" | cut -d' ' -f2; }
