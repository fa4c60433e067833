#!/bin/bash
# Usage: tests/slurm_cluster.sh start DIR
#        tests/slurm_cluster.sh stop DIR
#
# Starts (or stops) a one-node Slurm cluster on this machine for tests: munged (as the munge
# user, with its own key and socket), slurmctld and slurmd, all configured, logging and keeping
# their state under DIR, which must be empty or absent on start. Nothing under /etc, /run or
# /var is used or changed, and the ports are picked free for each start, so two clusters (or a
# second run after a failed one) do not meet.
#
# After start, DIR/env.sh sets SLURM_CONF (read by sbatch, srun, squeue, scontrol...) and
# MPT_SLURM_CLUSTER=DIR; source it before submitting. The node is NodeName=$(hostname -s),
# NodeAddr=127.0.0.1, CPUs=$(nproc) (or MPT_SLURM_CPUS when that is more); one partition
# "test"; MpiDefault=pmix. What works without systemd or cgroups (../shared/ENVIRONMENT.md):
# proctrack/linuxproc, task/none, jobacct_gather/none, SlurmUser=root.
#
# stop cancels every job, stops slurmd, slurmctld and munged by the pids in their pid files
# (SIGTERM, then SIGKILL after a few seconds), and kills by pid any process still carrying
# MPT_SLURM_CLUSTER=DIR in its environment (job tasks orphaned by a failed test). It is safe to
# call twice, and on a DIR whose start failed half way.
#
# Exit status: 0 done; 77 Slurm or munge not installed, or not root (the daemons and jobs run as
# root); 1 the cluster did not come up (the daemons' log tails are printed, and everything
# started is stopped again); 2 bad usage.
set -u

log() { echo "slurm_cluster: $*" >&2; }

usage() {
  echo "usage: $0 start|stop DIR" >&2
  exit 2
}

[ $# -eq 2 ] || usage
action=$1
dir=$2
case $dir in
  /*) ;;
  *) dir=$(pwd)/$dir ;;
esac

# pid_of FILE: the pid in FILE if that process is alive, else nothing.
pid_of() {
  local p
  [ -r "$1" ] || return 1
  p=$(tr -dc '0-9' <"$1")
  [ -n "$p" ] && kill -0 "$p" 2>/dev/null && echo "$p"
}

# stop_pids PID...: SIGTERM to all, wait up to 10 s for them to end, then SIGKILL.
stop_pids() {
  local i p alive
  [ $# -gt 0 ] || return 0
  kill -TERM "$@" 2>/dev/null
  for i in $(seq 1 100); do
    alive=
    for p in "$@"; do kill -0 "$p" 2>/dev/null && alive="$alive $p"; done
    [ -z "$alive" ] && return 0
    sleep 0.1
  done
  log "pid(s)$alive ignored SIGTERM for 10 s; sending SIGKILL"
  # shellcheck disable=SC2086 # a list of pids
  kill -KILL $alive 2>/dev/null
  return 0
}

# Pids of processes whose environment holds MPT_SLURM_CLUSTER=$dir (job tasks, steps), except
# this script, its subshells and its ancestors (a test that sourced env.sh and runs stop).
cluster_pids() {
  local e p mine=" $$ $BASHPID " q=$$ stat
  while [ "$q" -gt 1 ] 2>/dev/null; do
    read -r stat 2>/dev/null <"/proc/$q/stat" || break
    stat=${stat##*) }
    # shellcheck disable=SC2086 # the fields after the command name
    set -- $stat
    q=$2
    mine="$mine$q "
  done
  for e in /proc/[0-9]*/environ; do
    p=${e#/proc/}
    p=${p%/environ}
    case $mine in *" $p "*) continue ;; esac
    if grep -qzxF "MPT_SLURM_CLUSTER=$dir" "$e" 2>/dev/null; then
      echo "$p"
    fi
  done
}

do_stop() {
  local p i left
  if [ -r "$dir/slurm.conf" ] && [ -n "$(pid_of "$dir/slurmctld.pid")" ]; then
    SLURM_CONF=$dir/slurm.conf timeout 10 scancel --full --quiet --partition=test \
      >/dev/null 2>&1
    for i in $(seq 1 25); do
      [ -z "$(SLURM_CONF=$dir/slurm.conf timeout 5 squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
  # shellcheck disable=SC2046 # one pid or none each
  stop_pids $(pid_of "$dir/slurmd.pid") $(pid_of "$dir/slurmctld.pid")
  # shellcheck disable=SC2046
  stop_pids $(pid_of "$dir/munge/munged.pid")
  # Job tasks and slurmstepd processes of this cluster that outlived their daemons.
  left=$(cluster_pids)
  if [ -n "$left" ]; then
    log "killing leftover processes of this cluster: $(echo "$left" | tr '\n' ' ')"
    for p in $left; do kill -KILL "$p" 2>/dev/null; done
  fi
  return 0
}

# port_free N: nobody listens on TCP port N (IPv4 or IPv6).
port_free() {
  local hex
  hex=$(printf '%04X' "$1")
  ! awk -v h=":$hex" 'NR > 1 && substr($2, length($2) - 4) == h && $4 == "0A" { f = 1 }
                      END { exit !f }' /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# Two free adjacent ports in [20000, 30000), starting from a place that depends on this pid.
pick_ports() {
  local base=$(( 20000 + ($$ * 7 + $(date +%N | sed 's/^0*//;s/^$/0/') ) % 9990 )) i p
  for i in $(seq 0 200); do
    p=$(( 20000 + (base - 20000 + 2 * i) % 9990 ))
    if port_free "$p" && port_free $((p + 1)); then
      echo "$p"
      return 0
    fi
  done
  return 1
}

fail_start() {
  local f
  log "$*"
  for f in munge/munged.log slurmctld.log slurmd.log; do
    if [ -s "$dir/$f" ]; then
      echo "---- last lines of $dir/$f ----" >&2
      tail -n 15 "$dir/$f" >&2
    fi
  done
  do_stop
  exit 1
}

do_start() {
  local tool host cpus port i state runas
  for tool in munged slurmctld slurmd sbatch srun squeue scontrol scancel; do
    if ! command -v "$tool" >/dev/null 2>&1; then
      log "'$tool' not found (Debian: apt-get install slurmctld slurmd slurm-client munge)"
      exit 77
    fi
  done
  if [ "$(id -u)" -ne 0 ]; then
    log "must run as root (munged runs as the munge user, the daemons and jobs as root)"
    exit 77
  fi
  if ! id munge >/dev/null 2>&1; then
    log "no 'munge' user (Debian: apt-get install munge)"
    exit 77
  fi
  if command -v runuser >/dev/null 2>&1; then
    runas="runuser -u munge --"
  elif command -v setpriv >/dev/null 2>&1; then
    runas="setpriv --reuid=munge --regid=munge --init-groups"
  else
    log "neither runuser nor setpriv found (util-linux)"
    exit 77
  fi
  if [ -e "$dir" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
    log "$dir is not empty; refusing to start a cluster there"
    exit 2
  fi
  mkdir -p "$dir" || exit 1
  # munged checks the modes of the folders above its files: none may be writable by others.
  chmod 0711 "$dir"
  # shellcheck disable=SC2086
  if ! $runas test -x "$dir"; then
    log "the munge user cannot enter $dir: every folder above it must be searchable (chmod o+x)"
    exit 1
  fi
  mkdir -p "$dir/munge" "$dir/ctld" "$dir/spool" "$dir/tmp"
  chown munge:munge "$dir/munge"
  chmod 0755 "$dir/munge"
  if ! dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 2>/dev/null; then
    fail_start "cannot write a munge key"
  fi
  chown munge:munge "$dir/munge/munge.key"
  chmod 0600 "$dir/munge/munge.key"

  host=$(hostname -s)
  # MPT_SLURM_CPUS=N (more than nproc): the node says it has N CPUs (config_overrides), so a
  # test can submit jobs of more tasks than the machine has cores
  cpus=$(nproc)
  overrides=
  if [ "${MPT_SLURM_CPUS:-0}" -gt "$cpus" ]; then
    cpus=$MPT_SLURM_CPUS
    overrides=SlurmdParameters=config_overrides
  fi
  port=$(pick_ports) || fail_start "no two free adjacent TCP ports in [20000, 30000)"
  cat >"$dir/slurm.conf" <<EOF
# One-node test cluster written by tests/slurm_cluster.sh (state under $dir).
ClusterName=mpttest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket.2
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
TmpFS=$dir/tmp
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
SchedulerType=sched/backfill
ReturnToService=2
MailProg=/bin/true
InactiveLimit=0
KillWait=5
MinJobAge=600
SlurmctldTimeout=30
SlurmdTimeout=60
$overrides
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
  printf 'export SLURM_CONF=%s\nexport MPT_SLURM_CLUSTER=%s\n' "$dir/slurm.conf" "$dir" \
    >"$dir/env.sh"

  export SLURM_CONF=$dir/slurm.conf
  export MPT_SLURM_CLUSTER=$dir
  # shellcheck disable=SC2086 # runas is a command prefix
  if ! $runas munged --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket.2" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" \
    --seed-file="$dir/munge/munged.seed" >"$dir/munge/start.out" 2>&1; then
    cat "$dir/munge/start.out" >&2
    fail_start "munged did not start"
  fi
  for i in $(seq 1 50); do
    [ -S "$dir/munge/munge.socket.2" ] && [ -n "$(pid_of "$dir/munge/munged.pid")" ] && break
    sleep 0.1
  done
  [ -S "$dir/munge/munge.socket.2" ] || fail_start "munged made no socket within 5 s"

  slurmctld -f "$dir/slurm.conf" -i >"$dir/slurmctld.out" 2>&1 ||
    fail_start "slurmctld did not start"
  slurmd -f "$dir/slurm.conf" -N "$host" >"$dir/slurmd.out" 2>&1 || fail_start "slurmd did not start"
  state=
  for i in $(seq 1 150); do
    state=$(timeout 5 sinfo -h -N -n "$host" -o %T 2>/dev/null | head -n 1)
    case $state in
      idle) break ;;
    esac
    sleep 0.2
  done
  [ "$state" = idle ] || fail_start "node $host is '${state:-unknown}', not idle, after 30 s"
  log "cluster up in $dir (node $host, $cpus CPUs, ports $port-$((port + 1)))"
}

case $action in
  start) do_start ;;
  stop) do_stop ;;
  *) usage ;;
esac
