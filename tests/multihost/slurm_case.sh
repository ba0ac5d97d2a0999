#!/usr/bin/env bash
# tests/multihost/slurm_case.sh: a real Slurm on emulated hosts, running launch/slurm.sbatch.
#
#   slurm_case.sh --work DIR --rank LFM2_RANK --same RANK_TEST_FILES --model FILE.h5 --inputs IN.h5
#       --answers ANS.h5 --reference OUT.h5
#
# Two hosts (launch/netns-hosts.sh); Debian's munged, slurmctld and one slurmd per host, all inside
# the hosts' namespaces, with a generated slurm.conf (proctrack/linuxproc, task/none, no
# accounting) and every file they write (key, socket, state, spool, job temporaries, logs, pid
# files) in one temporary directory, removed at the end (the logs are copied to DIR); their ports
# exist only in the hosts' namespaces. Then `sbatch --nodes=2
# --ntasks-per-node=2 launch/slurm.sbatch`, twice: launched by srun (PMIx or PMI2, as
# `srun --mpi=list` offers) and by Open MPI's mpirun inside the allocation (LFM2_LAUNCHER=mpirun).
# Each job must complete with exit 0, validate (PASS) and write outputs bit-identical to the
# single-host reference. Everything is torn down when it exits. Skips (77), saying why, without
# root, without the Slurm and munge packages, or where the daemons cannot start.
set -euo pipefail
LFM2_SOURCE_DIR=$(cd "$(dirname "$0")/../.." && pwd)
. "$LFM2_SOURCE_DIR/tests/multihost/lib.sh"

WORK="" rank="" same="" model="" inputs="" answers="" ref=""
while [ $# -gt 0 ]; do
  case "$1" in
    --work) WORK=$2 ;; --rank) rank=$2 ;; --same) same=$2 ;; --model) model=$2 ;; --inputs) inputs=$2 ;;
    --answers) answers=$2 ;; --reference) ref=$2 ;;
    *) echo "slurm_case: unknown argument $1" >&2; exit 2 ;;
  esac
  shift 2
done
skip() { echo "slurm_case: skipped: $*"; exit 77; }
for tool in munged slurmctld slurmd sbatch srun scontrol sinfo; do
  command -v "$tool" >/dev/null || skip "no $tool (Debian: apt-get install slurmctld slurmd slurm-client munge; scripts/test.sh does as root)"
done
rm -rf "$WORK"
mkdir -p "$WORK"
hosts_up 2
# Slurm's files in a short temporary path (unix sockets allow 107 bytes: munge's, PMIx's), removed at
# the end; its logs are kept in DIR.
T=$(mktemp -d /tmp/lfm2-slurm.XXXXXX)
trap '"$HOSTS" down "$H"; cp "$T"/*.log "$WORK/" 2>/dev/null; rm -rf "$T"' EXIT
mkdir -p "$T/state" "$T/spool" "$T/tmp"
on() { "$HOSTS" run "$H" "$@"; }

# ---- munge: its own key, socket, seed, pid and log files.
dd if=/dev/urandom of="$T/munge.key" bs=1024 count=1 status=none
chmod 400 "$T/munge.key"
on node0 munged --force --origin=10.213.0.1 --socket="$T/munge.sock" --key-file="$T/munge.key" --pid-file="$T/munged.pid" \
  --log-file="$T/munged.log" --seed-file="$T/munged.seed" ||
  skip "munged did not start: $(tail -2 "$T/munged.log" 2>/dev/null | tr '\n' ' ')"

# ---- slurm.conf: the two hosts, two CPUs each (as configured, whatever this machine has).
cat >"$T/slurm.conf" <<EOF
ClusterName=lfm2test
SlurmctldHost=node0(10.213.0.1)
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$T/munge.sock
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool/%n
TmpFS=$T/tmp/%n
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.%n.pid
SlurmctldLogFile=$T/slurmctld.log
SlurmdLogFile=$T/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=30
KillWait=2
MinJobAge=300
PropagateResourceLimits=NONE
NodeName=node0 NodeAddr=10.213.0.1 CPUs=2 RealMemory=1000 State=UNKNOWN
NodeName=node1 NodeAddr=10.213.0.2 CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=test Nodes=node0,node1 Default=YES MaxTime=INFINITE State=UP
EOF
# No cgroups: linuxproc tracks processes; slurmd still loads a cgroup plugin, which only needs to
# find nothing to do (the hosts' /sys has no cgroup mount; nothing is created under it).
mkdir -p "$T/cgroup"
printf 'CgroupPlugin=cgroup/v1\nCgroupMountpoint=%s\n' "$T/cgroup" >"$T/cgroup.conf"
export SLURM_CONF=$T/slurm.conf
on node0 slurmctld -f "$SLURM_CONF" || skip "slurmctld did not start: $(tail -3 "$T/slurmctld.log" 2>/dev/null | tr '\n' ' ')"
for h in node0 node1; do
  mkdir -p "$T/spool/$h" "$T/tmp/$h"
  on "$h" slurmd -f "$SLURM_CONF" -N "$h" || skip "slurmd on $h did not start: $(tail -3 "$T/slurmd.$h.log" 2>/dev/null | tr '\n' ' ')"
done
t0=$(now)
until [ "$(on node0 sinfo -h -o '%T %D' 2>/dev/null)" = "idle 2" ]; do
  if [ "$(ms_since "$t0")" -gt 30000 ]; then
    on node0 sinfo 2>&1 || true
    tail -n 5 "$T/slurmctld.log" "$T"/slurmd.*.log || true
    skip "the Slurm nodes did not come up idle within 30 s"
  fi
  sleep 0.5
done
echo "slurm_case: Slurm up in $(secs "$(ms_since "$t0")") s: $(on node0 sinfo -h -o '%P %D nodes %T %N')"

# ---- the jobs. The hosts' interface carries MPI (no shared memory); as root Open MPI needs its
# two variables, which sbatch passes on with the rest of this environment.
export LFM2_RANK=$rank OMPI_MCA_btl=tcp,self OMPI_MCA_btl_tcp_if_include=lfm2net OMPI_MCA_oob_tcp_if_include=lfm2net
fails=0
for launcher in srun mpirun; do
  out=$WORK/out-$launcher.h5
  id=$(cd "$WORK" && LFM2_LAUNCHER=$launcher on node0 sbatch --parsable --nodes=2 --ntasks-per-node=2 \
    --cpus-per-task=1 --gpus-per-node=0 --output="$WORK/job-$launcher.log" "$LFM2_SOURCE_DIR/launch/slurm.sbatch" \
    --device cpu --model "$model" --inputs "$inputs" --answers "$answers" --output "$out" --timeout 60)
  t0=$(now)
  while state=$(on node0 scontrol show job "$id" -o | grep -o 'JobState=[A-Z_]*' | cut -d= -f2) &&
    [[ $state =~ ^(PENDING|CONFIGURING|RUNNING|COMPLETING)$ ]]; do
    if [ "$(ms_since "$t0")" -gt 90000 ]; then on node0 scancel "$id" || true; break; fi
    sleep 0.5
  done
  info=$(on node0 scontrol show job "$id" -o)
  echo "slurm_case: job $id ($launcher) after $(secs "$(ms_since "$t0")") s: $(grep -o 'JobState=[A-Z_]* .*ExitCode=[0-9:]*' <<<"$info" | sed 's/ Reason=/ /;s/ Dependency=.* ExitCode/ ExitCode/')"
  sed 's/^/  | /' "$WORK/job-$launcher.log"
  why=""
  grep -q 'JobState=COMPLETED' <<<"$info" && grep -q 'ExitCode=0:0' <<<"$info" || why="did not complete with exit 0"
  [ -z "$why" ] && { grep -q "^slurm.sbatch: 4 ranks on 2 node(s): node\[0-1\], launched by $launcher" "$WORK/job-$launcher.log" || why="not 4 ranks on node[0-1] by $launcher"; }
  [ -z "$why" ] && { grep -q 'plan: rank 3 (local 1)' "$WORK/job-$launcher.log" || why="rank 3 is not node1's second rank"; }
  [ -z "$why" ] && { grep -q "validation: PASS" "$WORK/job-$launcher.log" || why="no 'validation: PASS'"; }
  [ -z "$why" ] && { "$same" same "$ref" "$out" || why="the outputs differ from the single-host run's"; }
  if [ -n "$why" ]; then echo "slurm_case: FAIL ($launcher): $why"; fails=$((fails + 1)); else echo "slurm_case: ok ($launcher)"; fi
done
[ "$fails" -eq 0 ] || { tail -n 20 "$T/slurmctld.log" "$T"/slurmd.*.log; fail "$fails of 2 jobs failed"; }
echo "slurm_case: PASS (srun and mpirun, 4 ranks on 2 Slurm nodes)"
