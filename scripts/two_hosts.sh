#!/bin/bash
# Two "hosts" on one machine, for multi-node tests of mpitrain over TCP.
#
# Usage:
#   scripts/two_hosts.sh setup                 make the two hosts (network namespaces + veth pair)
#   scripts/two_hosts.sh run PROGRAM [ARGS...] mpirun PROGRAM across them (from host1)
#   scripts/two_hosts.sh exec HOST CMD [ARGS...]  run a command on one host (host1 or host2)
#   scripts/two_hosts.sh kill HOST             SIGKILL every process on HOST (a node failure)
#   scripts/two_hosts.sh status                the namespaces, addresses and processes
#   scripts/two_hosts.sh teardown              kill everything on both hosts, delete them
#   scripts/two_hosts.sh demo PROGRAM [ARGS...]   setup + run + teardown (also on failure or ^C)
#   scripts/two_hosts.sh agent HOST CMD...     (the launch agent mpirun calls in place of ssh)
#
# Example (as root, from a build directory):
#   ../scripts/two_hosts.sh demo ./mpitrain train --synthetic --epochs 1 --no-progress
#
# What a "host" is: a network namespace NAME-host1 / NAME-host2, joined by one veth pair (the
# interface is called mpt0 on both sides) with the addresses NET.1/24 and NET.2/24 (default
# 10.231.0.1 and 10.231.0.2, a private range that exists only on that veth, so the traffic stays
# between the two namespaces; there is no route anywhere else), plus a loopback that is up. Each
# command on a host also gets its own UTS namespace whose host name is host1 or host2 (so
# gethostname, Open MPI's node names and mpitrain's "host ..." line differ, as on two machines)
# and its own TMPDIR (Open MPI's session directories do not meet). The file system is shared,
# like a cluster's shared file system: checkpoints written by rank 0 are visible to every rank.
#
# How mpirun reaches host2: Open MPI's rsh launcher (--mca plm rsh) is pointed at STATE/agent
# (--mca plm_rsh_agent), which runs "two_hosts.sh agent HOST CMD...". Open MPI calls it like ssh:
# the host name, then the command line of its daemon (orted) as shell words. The agent looks the
# name up in STATE/hosts (an /etc/hosts-like "ADDRESS NAME" map), enters that host's namespace
# with `ip netns exec`, and runs the command under /bin/sh, as sshd would. mpirun itself runs on
# host1, which Open MPI recognises as its own node (same host name), so only host2 is launched
# through the agent. Transport: pml ob1 with btl tcp,self (no shared memory between the hosts),
# and both the MPI traffic (btl_tcp_if_include) and Open MPI's out-of-band channel
# (oob_tcp_if_include) are restricted to NET.0/24. Ranks go round-robin over the hosts (--map-by
# node): rank 0 on host1, rank 1 on host2, rank 2 on host1...
#
# Losing a host: when a daemon launched through the agent dies of a signal (every process on
# that host was killed), the agent prints "two_hosts: host HOST: its Open MPI daemon was killed by
# signal N". Open MPI itself names only the host ("Peer host: host2", "unable to reliably start
# one or more daemons"), so after a failed run, `run` prints "two_hosts: lost host HOST, which ran
# rank(s) R..." for each lost host, mapping hosts to ranks with the "mpitrain: rank R/N ... host
# H" lines the ranks print at start (or, for a program that prints none, the round-robin map).
#
# Environment:
#   MPT_TWOHOST_NAME     instance name, the namespaces' prefix (default mpt2h; at most 9 chars)
#   MPT_TWOHOST_DIR      state directory (default ${TMPDIR:-/tmp}/NAME.twohost): hostfile,
#                        hosts, agent, per-host TMPDIRs, last.log (the last run's output)
#   MPT_TWOHOST_NET      first three octets of the /24 (default 10.231.0)
#   MPT_TWOHOST_SLOTS    ranks per host (default 1); run starts 2 x SLOTS ranks
#   MPT_TWOHOST_TIMEOUT  seconds after which run kills the job (default 600; status 124)
#   MPT_MPIRUN_ARGS      extra mpirun arguments (e.g. "-x MPT_TEST_KILL_RANK")
#   MPIRUN               the mpirun to use (default mpirun)
#
# Needs root (or CAP_SYS_ADMIN + CAP_NET_ADMIN), iproute2 (`ip`; Debian: apt-get install
# iproute2), unshare (util-linux) and Open MPI's mpirun. Every step that waits is bounded.
#
# Exit status: setup: 0, 77 when namespaces cannot be made here (not root, no CAP_SYS_ADMIN,
# no `ip`), 1 on other failures; run/demo: the job's (mpirun's) status, 124 on timeout; kill,
# teardown: 0 (teardown is safe to call twice, and after a setup that failed half way);
# 2 on bad usage.
set -u

self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
name=${MPT_TWOHOST_NAME:-mpt2h}
state=${MPT_TWOHOST_DIR:-${TMPDIR:-/tmp}/$name.twohost}
net=${MPT_TWOHOST_NET:-10.231.0}
slots=${MPT_TWOHOST_SLOTS:-1}
limit=${MPT_TWOHOST_TIMEOUT:-600}
mpirun=${MPIRUN:-mpirun}
hosts=(host1 host2)
ifname=mpt0

log() { echo "two_hosts: $*" >&2; }

usage() { # STATUS: 0 for --help (to stdout), 2 for bad usage (to stderr)
  if [ "${1:-2}" -eq 0 ]; then
    sed -n '4,12p' "$0" | sed 's/^# \{0,1\}//'
  else
    sed -n '4,12p' "$0" | sed 's/^# \{0,1\}//' >&2
  fi
  exit "${1:-2}"
}

ns_of() { # HOST: the namespace of host1/host2 (or of its address), nothing for others
  case $1 in
    host1 | "$net.1") echo "$name-host1" ;;
    host2 | "$net.2") echo "$name-host2" ;;
    *) return 1 ;;
  esac
}

hostname_of() { # HOST or its address: host1/host2
  case $1 in
    host1 | "$net.1") echo host1 ;;
    host2 | "$net.2") echo host2 ;;
  esac
}

ns_exists() { ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$1"; }

# kill_ns NS: SIGKILL every process in NS until none is left (at most ~5 s).
kill_ns() {
  local _ pids
  for _ in $(seq 1 50); do
    pids=$(ip netns pids "$1" 2>/dev/null)
    [ -z "$pids" ] && return 0
    # shellcheck disable=SC2086 # a list of pids
    kill -KILL $pids 2>/dev/null
    sleep 0.1
  done
  log "processes still in namespace $1 after 5 s: $(ip netns pids "$1" 2>/dev/null | tr '\n' ' ')"
  return 1
}

# on_host HOST CMD...: CMD inside HOST's network namespace, in a new UTS namespace named after
# HOST, with HOST's TMPDIR.
on_host() {
  local h=$1 ns
  shift
  ns=$(ns_of "$h") || { log "unknown host '$h' (host1 or host2)"; return 2; }
  # shellcheck disable=SC2016 # expanded by that shell
  ip netns exec "$ns" unshare --uts /bin/sh -c \
    'hostname "$0" && TMPDIR="$1" && export TMPDIR && shift && exec "$@"' \
    "$(hostname_of "$h")" "$state/tmp-$(hostname_of "$h")" "$@"
}

do_teardown() {
  local h ns
  for h in "${hosts[@]}"; do
    ns=$name-$h
    if ns_exists "$ns"; then
      kill_ns "$ns"
      ip netns del "$ns" 2>/dev/null || log "could not delete namespace $ns"
    fi
  done
  # Deleting a namespace deletes the veth end inside it, and with it its peer.
  rm -rf "$state"
  return 0
}

# The second namespace, the veth pair between the two, addresses, links up.
make_link() {
  local h
  ip netns add "$name-host2" || return 1
  # Both ends are created directly inside the namespaces: no name is ever used in the root one.
  ip -n "$name-host1" link add "$ifname" type veth peer name "$ifname" netns "$name-host2" || return 1
  ip -n "$name-host1" addr add "$net.1/24" dev "$ifname" || return 1
  ip -n "$name-host2" addr add "$net.2/24" dev "$ifname" || return 1
  for h in "${hosts[@]}"; do
    ip -n "$name-$h" link set lo up || return 1
    ip -n "$name-$h" link set "$ifname" up || return 1
  done
}

do_setup() {
  local h
  command -v ip >/dev/null 2>&1 || { log "'ip' not found (Debian: apt-get install iproute2)"; return 77; }
  command -v unshare >/dev/null 2>&1 || { log "'unshare' not found (Debian: util-linux)"; return 77; }
  if [ ${#name} -gt 9 ]; then log "MPT_TWOHOST_NAME '$name' is longer than 9 characters"; return 2; fi
  for h in "${hosts[@]}"; do
    if ns_exists "$name-$h"; then
      log "namespace $name-$h exists already (run '$0 teardown' first, or set MPT_TWOHOST_NAME)"
      return 1
    fi
  done
  if ! ip netns add "$name-host1" 2>/dev/null; then
    log "cannot create network namespaces here (not root, or no CAP_SYS_ADMIN)"
    return 77
  fi
  if ! make_link; then
    log "setting up the namespaces or the veth pair failed; undoing"
    do_teardown
    return 1
  fi
  mkdir -p "$state/tmp-host1" "$state/tmp-host2" || { do_teardown; return 1; }
  printf '%s.1 host1\n%s.2 host2\n' "$net" "$net" >"$state/hosts"
  printf 'host1 slots=%s\nhost2 slots=%s\n' "$slots" "$slots" >"$state/hostfile"
  # mpirun splits plm_rsh_agent at blanks, so the agent is a file of its own in the state dir.
  cat >"$state/agent" <<EOF
#!/bin/sh
# Launch agent for Open MPI (plm_rsh_agent): enters a two_hosts.sh host instead of ssh.
MPT_TWOHOST_NAME='$name' MPT_TWOHOST_DIR='$state' MPT_TWOHOST_NET='$net' exec '$self' agent "\$@"
EOF
  chmod +x "$state/agent"
  log "hosts host1 ($net.1, namespace $name-host1) and host2 ($net.2, namespace $name-host2) are up; state in $state"
  return 0
}

# The launch agent: HOST CMD... (Open MPI may put options before the host, as for ssh: skip them).
do_agent() {
  local h ns rc
  while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
  [ $# -ge 2 ] || { log "agent: usage: agent HOST COMMAND..."; return 255; }
  h=$1
  shift
  ns=$(ns_of "$h") || { log "agent: unknown host '$h' (not in $state/hosts)"; return 255; }
  ns_exists "$ns" || { log "agent: host '$h' is down (no namespace $ns)"; return 255; }
  # Like sshd: the words are joined into one command line for the host's shell.
  on_host "$h" /bin/sh -c "$*"
  rc=$?
  if [ $rc -gt 128 ] && [ $rc -lt 160 ]; then
    log "host $(hostname_of "$h"): its Open MPI daemon was killed by signal $((rc - 128)) (every process on the host is gone?)"
  fi
  return $rc
}

# report_lost LOG: after a failed run, names the ranks of the hosts that were lost.
report_lost() {
  local logf=$1 lost h ranks np
  lost=$(sed -n -e 's/.*two_hosts: host \(host[12]\): its Open MPI daemon was killed.*/\1/p' \
    -e 's/.*Remote daemon:.* on node \(host[12]\).*/\1/p' "$logf" | sort -u)
  np=$((2 * slots))
  for h in $lost; do
    ranks=$(sed -n "s/.*mpitrain: rank \([0-9][0-9]*\)\/[0-9]* .* host $h .*/\1/p" "$logf" | sort -n | tr '\n' ' ')
    if [ -z "$ranks" ]; then # round-robin map of --map-by node
      ranks=$(seq 0 $((np - 1)) | awk -v want="${h#host}" '($1 % 2) + 1 == want' | tr '\n' ' ')
    fi
    echo "two_hosts: lost host $h, which ran rank(s) ${ranks% }"
  done
}

do_run() {
  local h rc start elapsed logf
  [ $# -ge 1 ] || usage
  for h in "${hosts[@]}"; do
    ns_exists "$name-$h" || { log "host $h is not set up (run '$0 setup' first)"; return 1; }
  done
  command -v "$mpirun" >/dev/null 2>&1 || { log "'$mpirun' not found (Debian: apt-get install openmpi-bin)"; return 77; }
  logf=$state/last.log
  : >"$logf"
  start=$(date +%s)
  # shellcheck disable=SC2086 # MPT_MPIRUN_ARGS is a list of words on purpose
  on_host host1 timeout -k 10 "$limit" "$mpirun" --allow-run-as-root --oversubscribe \
    --hostfile "$state/hostfile" -np $((2 * slots)) --map-by node --bind-to none \
    --mca plm rsh --mca plm_rsh_agent "$state/agent" --mca plm_rsh_no_tree_spawn 1 \
    --mca pml ob1 --mca btl tcp,self \
    --mca btl_tcp_if_include "$net.0/24" --mca oob_tcp_if_include "$net.0/24" \
    -x OPENBLAS_NUM_THREADS=1 ${MPT_MPIRUN_ARGS:-} "$@" 2>&1 | tee -a "$logf"
  rc=${PIPESTATUS[0]}
  elapsed=$(($(date +%s) - start))
  if [ "$rc" -eq 124 ] || { [ "$rc" -eq 137 ] && [ "$elapsed" -ge "$limit" ]; }; then
    log "'$*' did not finish within $limit s; killed"
    rc=124
  fi
  if [ "$rc" -ne 0 ]; then
    report_lost "$logf" | tee -a "$logf"
  fi
  return "$rc"
}

do_status() {
  local h ns
  for h in "${hosts[@]}"; do
    ns=$name-$h
    if ns_exists "$ns"; then
      echo "$h: namespace $ns, $(ip -n "$ns" -4 -o addr show dev "$ifname" 2>/dev/null | awk '{print $4}'), processes: $(ip netns pids "$ns" | tr '\n' ' ')"
    else
      echo "$h: down"
    fi
  done
}

[ $# -ge 1 ] || usage
cmd=$1
shift
case $cmd in
  -h|--help) usage 0 ;;
  setup) do_setup ;;
  teardown) do_teardown ;;
  run) do_run "$@" ;;
  agent) do_agent "$@" ;;
  exec)
    [ $# -ge 2 ] || usage
    on_host "$@"
    ;;
  kill)
    [ $# -eq 1 ] || usage
    ns=$(ns_of "$1") || { log "unknown host '$1' (host1 or host2)"; exit 2; }
    kill_ns "$ns"
    ;;
  status) do_status ;;
  demo)
    trap 'do_teardown' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    do_setup || exit $?
    do_run "$@"
    ;;
  *) usage ;;
esac
