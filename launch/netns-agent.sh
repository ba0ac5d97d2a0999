#!/usr/bin/env bash
# launch/netns-agent.sh HOST COMMAND...: Open MPI's plm_rsh_agent for the hosts of
# launch/netns-hosts.sh (set by `netns-hosts.sh mpirun`), in place of ssh: runs COMMAND on HOST,
# i.e. in its namespaces, through a shell as ssh would (Open MPI passes orted's command line as
# words to be joined). NETNS_HOSTS_DIR names the hosts' state directory. The environment passes
# through as it is (no ssh in between), so OMPI_ALLOW_RUN_AS_ROOT and the like reach orted.
set -euo pipefail
[ -n "${NETNS_HOSTS_DIR:-}" ] || { echo "netns-agent: error: NETNS_HOSTS_DIR is not set" >&2; exit 1; }
host=$1
shift
exec "$(dirname "$0")/netns-hosts.sh" run "$NETNS_HOSTS_DIR" "$host" sh -c "$*"
