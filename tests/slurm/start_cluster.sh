#!/usr/bin/env bash
# Start a one-node Slurm cluster on this machine, for the tests (Debian's
# slurm-wlm + munge; as root).  Usage:
#
#   eval "$(bash tests/slurm/start_cluster.sh DIR)"     # exports SLURM_CONF
#   bash tests/slurm/start_cluster.sh --stop DIR
#
# DIR holds slurm.conf, the daemons' state, spool, pid and log files.  The
# node is this machine under its real hostname with its real CPU count; one
# partition "debug".  Accounting is off (sacct prints warnings: expected).
# Exits non-zero, saying why on stderr, where Slurm cannot start (not
# installed, not root, a daemon that does not come up); the tests then skip
# with that reason.
set -euo pipefail

stop=0
if [[ "${1:-}" == "--stop" ]]; then stop=1; shift; fi
dir=${1:?usage: start_cluster.sh [--stop] DIR}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
conf="$dir/slurm.conf"
# One start or stop at a time: test workers that reach the cluster together must not race to start munged or
# slurmctld (a second munged fails to bind the socket; a second slurmctld -c wipes the first one's queue).
# The daemons started below must not inherit the lock's descriptor (9>&-): they would hold the lock for their
# lifetime and the next stop would wait on it for ever.
if command -v flock >/dev/null; then exec 9>"$dir.lock"; flock -w 240 9 || { echo "Slurm cannot start: $dir.lock held for 240 s" >&2; exit 3; }; fi

kill_pidfile() {
  local f=$1
  if [[ -s "$f" ]]; then
    local pid; pid=$(cat "$f")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$f"
  fi
}

if (( stop )); then
  kill_pidfile "$dir/slurmd.pid"
  kill_pidfile "$dir/slurmctld.pid"
  exit 0
fi

for tool in munged slurmctld slurmd sbatch srun scontrol sinfo; do
  command -v "$tool" >/dev/null || { echo "Slurm cannot start: '$tool' is not installed (apt-get install slurm-wlm munge)" >&2; exit 2; }
done
[[ $(id -u) == 0 ]] || { echo "Slurm cannot start: the test cluster's daemons run as root (SlurmUser=root); this is uid $(id -u)" >&2; exit 2; }

host=$(hostname -s)
cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)   # nproc obeys OMP_NUM_THREADS, which the tests set to 1
mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
ctld_port=${FEDCLUST_SLURMCTLD_PORT:-16817}
d_port=${FEDCLUST_SLURMD_PORT:-16818}
mkdir -p "$dir/state" "$dir/spool"

cat > "$conf" <<CONF
ClusterName=fedclust-test
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
JobRequeue=1
MinJobAge=600
KillWait=10
InactiveLimit=0
SlurmdTimeout=60
MessageTimeout=60
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
NodeName=$host CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF=$conf

# munge: one daemon for the machine (its socket is fixed); start it if none answers.
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
  mkdir -p /run/munge && chown munge:munge /run/munge 2>/dev/null || true
  if [[ ! -s /etc/munge/munge.key ]]; then
    (command -v mungekey >/dev/null && mungekey --create --force) || \
      dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 2>/dev/null
    chown munge:munge /etc/munge/munge.key 2>/dev/null || true; chmod 400 /etc/munge/munge.key
  fi
  munged --force 2>"$dir/munged.err" 9>&- || { echo "Slurm cannot start: munged failed: $(cat "$dir/munged.err")" >&2; exit 3; }
  for _ in $(seq 50); do munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n </dev/null | unmunge >/dev/null 2>&1 || { echo "Slurm cannot start: munged does not answer" >&2; exit 3; }
fi

start_slurmd() {
  slurmd -f "$conf" -c 9>&- || { echo "Slurm cannot start: slurmd failed; $dir/slurmd.log: $(tail -5 "$dir/slurmd.log" 2>/dev/null)" >&2; exit 3; }
}
# A cluster of this DIR already up answers sinfo: keep it, starting its node daemon again if that one is gone
# (an earlier run's controller outlived its slurmd: the node would stay "not responding").
if ! timeout 10 sinfo -h >/dev/null 2>&1; then
  kill_pidfile "$dir/slurmd.pid"
  kill_pidfile "$dir/slurmctld.pid"
  slurmctld -f "$conf" -c -i 9>&- || { echo "Slurm cannot start: slurmctld failed; $dir/slurmctld.log: $(tail -5 "$dir/slurmctld.log" 2>/dev/null)" >&2; exit 3; }
  start_slurmd
elif ! { [[ -s "$dir/slurmd.pid" ]] && kill -0 "$(cat "$dir/slurmd.pid")" 2>/dev/null; }; then
  rm -f "$dir/slurmd.pid"
  start_slurmd
  scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true
fi

# Wait for the node to take jobs.
state=""
for _ in $(seq 120); do
  state=$(sinfo -h -n "$host" -o %T 2>/dev/null | head -1 || true)
  [[ "$state" == idle* || "$state" == mixed* || "$state" == allocated* ]] && break
  sleep 0.5
done
if [[ "$state" != idle* && "$state" != mixed* && "$state" != allocated* ]]; then
  echo "Slurm cannot start: node $host is '${state:-unknown}' after 60 s; $dir/slurmctld.log: $(tail -5 "$dir/slurmctld.log" 2>/dev/null)" >&2
  exit 3
fi
echo "export SLURM_CONF=$conf"
