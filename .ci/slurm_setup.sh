#!/usr/bin/env bash
# A real single-node Slurm on localhost for the launcher tests (Debian 12, no systemd; see
# ../shared/reference/slurm-local.md): munged + slurmctld + slurmd from the distribution's packages, started by hand,
# with a short requeue delay (cred_expire=10, sched_interval=2) and a `sacct` shim over `squeue` so that submitit
# sees real job states (a job cancelled from outside must read CANCELLED, not hang) without slurmdbd + MariaDB.
# Idempotent: does nothing when a controller already answers. Needs root (or sudo).
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
  exec sudo -n -E bash "$0" "$@"
fi

if command -v scontrol >/dev/null && scontrol ping 2>/dev/null | grep -q 'is UP'; then
  echo "slurm: a controller is already up"; sinfo; exit 0
fi

start=$(date +%s)
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null \
   || ! command -v munged >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
fi

# munge: its postinst made the key; the runtime dir is normally systemd's job.
mkdir -p /run/munge && chown munge:munge /run/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
fi

mkdir -p /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /etc/slurm
chown slurm:slurm /var/spool/slurmctld /var/log/slurm
# The node line is what this machine reports (CPUs, sockets, cores, memory); the node is called localhost.
node=$(slurmd -C | head -n1 | sed -E 's/^NodeName=[^ ]+/NodeName=localhost NodeAddr=127.0.0.1/')
cat > /etc/slurm/slurm.conf <<CONF
# Written by .ci/slurm_setup.sh: one node on localhost for CI.
ClusterName=localci
SlurmctldHost=localhost
SlurmUser=slurm
AuthType=auth/munge
AuthInfo=cred_expire=10          # default 120 s = how long a requeued job waits before it may restart
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core     # memory not consumable: jobs need no --mem and do not block each other
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=1
ReturnToService=2
MailProg=/bin/true
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
InactiveLimit=0
KillWait=5
MinJobAge=3600                   # the sacct shim reads finished jobs from squeue: keep them for an hour
Waittime=0
$node State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF

# sacct without slurmdbd only says "accounting storage is disabled"; submitit then never sees a job die.
cat > /usr/local/bin/sacct <<'SHIM'
#!/usr/bin/env bash
# CI shim (.ci/slurm_setup.sh): answers submitit's `sacct -o JobID,State,NodeList --parsable2 -j ID ...` from
# squeue, which knows jobs for MinJobAge after they end. Other sacct uses go to the real one.
ids=()
while [ $# -gt 0 ]; do
  case "$1" in
    -j|--jobs) ids+=("$2"); shift 2 ;;
    -j*) ids+=("${1#-j}"); shift ;;
    --jobs=*) ids+=("${1#--jobs=}"); shift ;;
    -o|--format) shift 2 ;;
    --format=*|--parsable2|-P|-n|--noheader|-X|--allocations) shift ;;
    *) exec /usr/bin/sacct "$@" ;;
  esac
done
echo "JobID|State|NodeList"
for id in "${ids[@]}"; do   # one call per id: squeue fails the whole list if one id is unknown
  squeue -h -t all -j "$id" -o '%i|%T|%N' 2>/dev/null || true
done
SHIM
chmod 755 /usr/local/bin/sacct

rm -f /run/slurmctld.pid   # left behind by a previous SIGTERM (gotcha 14)
# -c: start from an empty queue. A machine that ran these tests before keeps the old controller's saved jobs, and one
# whose batch directory could not be made (a full disk) holds the only node allocated, so no test job would ever start.
/usr/sbin/slurmctld -c
{ [ -f /run/slurmd.pid ] && kill -0 "$(cat /run/slurmd.pid)" 2>/dev/null; } || /usr/sbin/slurmd -c -N localhost
for _ in $(seq 100); do
  sinfo -h -o '%t' 2>/dev/null | grep -qx idle && break
  sleep 0.2
done
# A node left down or drained by an earlier run (a failed batch setup drains it) is put back once.
if sinfo -h -o '%t' | grep -qE '^(down|drain|drng|fail)'; then
  scontrol update NodeName=localhost State=RESUME || true
  for _ in $(seq 50); do sinfo -h -o '%t' 2>/dev/null | grep -qx idle && break; sleep 0.2; done
fi
sinfo -h -o '%t' | grep -qx idle || { echo "slurm: node did not become idle" >&2; sinfo >&2; \
  tail -n 20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log >&2; exit 1; }
echo "slurm: up in $(( $(date +%s) - start )) s"; sinfo
