# A real Slurm cluster on this one machine, for the tests (bash, sourced): munged, slurmctld and
# one slurmd per node, each node in its own network namespace (its own address on a veth pair to a
# bridge) and UTS namespace (its own hostname). Processes share the file system, which plays the
# cluster's shared file system. Needs root, iproute2, unshare, slurm-wlm and munge.
#
#   slurm_cluster_start DIR [NODES]   start NODES (default 2) nodes "node1".."nodeN"; config etc. in DIR
#   slurm_cluster_stop                stop every daemon, delete the namespaces, links and DIR's state
#   slurm_submit_wait SCRIPT ARGS...  sbatch --wait with a deadline; sets $job and $rc
#   slurm_cluster_skip_reason         prints why a cluster cannot be had here (nothing when it can)
#
# Addresses: 10.77.<k>.0/24 with the bridge at .1 (slurmctld listens there) and node i at .(10 + i).
# Only these namespaces' own addresses are ever contacted.

SLURM_TEST_NET=${SLURM_TEST_NET:-10.77.0}
_slurm_dir="" _slurm_nodes=0 _slurm_tag=""

slurm_cluster_skip_reason() {
  [ "$(id -u)" -eq 0 ] || { echo "not root (network and UTS namespaces need root)"; return; }
  local t
  for t in slurmctld slurmd sbatch munged ip unshare nsenter; do
    command -v "$t" >/dev/null || { echo "'$t' is missing (Debian: slurm-wlm, munge, iproute2, util-linux)"; return; }
  done
  ip netns add mpiddp-probe-$$ 2>/dev/null || { echo "cannot create network namespaces here (ip netns add failed)"; return; }
  ip netns delete mpiddp-probe-$$
  unshare --uts true 2>/dev/null || { echo "cannot create UTS namespaces here (unshare --uts failed)"; return; }
}

# Leftovers of a run that was killed before its cleanup (its daemons hold the ports): namespaces
# and links are named mpd<pid of the test>..., daemons run from /tmp/mpiddp-slurm-*.
_slurm_reap_stale() {
  local ns pid
  for ns in $(ip netns list 2>/dev/null | grep -o '^mpd[0-9]*n[0-9]*'); do
    pid=${ns#mpd}
    pid=${pid%%n*}
    kill -0 "$pid" 2>/dev/null && continue
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
    ip netns delete "$ns" 2>/dev/null
    ip link delete "mpd${pid}br" 2>/dev/null
  done
  for pid in $(pgrep -f -- "$_slurm_reap_pattern"); do
    local cluster owner
    cluster=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -o -- "$_slurm_reap_pattern" | head -n 1)
    owner=$(cat "$cluster/owner.pid" 2>/dev/null)
    { [ -z "$owner" ] || ! kill -0 "$owner" 2>/dev/null; } && kill -9 "$pid" 2>/dev/null
  done
}
_slurm_reap_pattern='/tmp/mpiddp-slurm-[A-Za-z0-9]*/cluster'

slurm_cluster_start() {
  local dir=$1 nodes=${2:-2} i
  _slurm_reap_stale
  _slurm_dir=$dir _slurm_nodes=$nodes _slurm_tag=mpd$$
  mkdir -p "$dir"/{state,log,spool,munge}
  echo $$ >"$dir/owner.pid"
  for i in $(seq 1 "$nodes"); do mkdir -p "$dir/spool/node$i"; done
  local br=${_slurm_tag}br ctl_addr=$SLURM_TEST_NET.1
  ip link add "$br" type bridge || return 1
  ip addr add "$ctl_addr/24" dev "$br" && ip link set "$br" up || return 1
  for i in $(seq 1 "$nodes"); do
    local ns=${_slurm_tag}n$i
    ip netns add "$ns" || return 1
    ip link add "${_slurm_tag}v$i" type veth peer name eth0 netns "$ns" || return 1
    ip link set "${_slurm_tag}v$i" master "$br" up
    ip -n "$ns" addr add "$SLURM_TEST_NET.$((10 + i))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
  done

  # munge: its own key, socket and state, so the machine's munged (if any) is left alone.
  dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
  chmod 0400 "$dir/munge/munge.key"
  chmod 0755 "$dir/munge"  # clients reach the socket through it
  munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.sock" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/seed" || return 1

  local nodelist="node[1-$nodes]"
  # A requeued job may start again once its first run's credential has expired (cred_expire=10: 11 s
  # instead of 121), at the main scheduling loop's next pass (Slurm's every 60 s). A pass every 2 s
  # (sched_interval=2) saved ~45 s of system.slurm_jobs, but its one run beside the whole suite saw
  # batch/srun.sh fail (reason not kept; not reproduced in 14 runs): left at Slurm's default.
  cat >"$dir/slurm.conf" <<EOF
ClusterName=mpiddptest
SlurmctldHost=$(hostname -s)($ctl_addr)
SlurmctldPort=6917
SlurmdPort=6918
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.sock,cred_expire=10
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/spool/slurmd.%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
MessageTimeout=30
KillWait=5
InactiveLimit=0
MinJobAge=600
JobRequeue=1
PropagateResourceLimitsExcept=ALL
EOF
  for i in $(seq 1 "$nodes"); do
    echo "NodeName=node$i NodeAddr=$SLURM_TEST_NET.$((10 + i)) NodeHostname=node$i CPUs=2 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=2000 State=UNKNOWN" >>"$dir/slurm.conf"
  done
  echo "PartitionName=test Nodes=$nodelist Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO" >>"$dir/slurm.conf"
  export SLURM_CONF=$dir/slurm.conf

  slurmctld -i -f "$dir/slurm.conf" || return 1
  for i in $(seq 1 "$nodes"); do
    # Its own hostname (UTS) and network; everything else (files, /dev/shm, /sys/fs/cgroup) shared:
    # nsenter, unlike `ip netns exec`, keeps the mount namespace as it is.
    # Each slurmd reads its own copy of slurm.conf so that its mpi.conf can give PMIx a directory
    # of its own (the nodes share /tmp, where PMIx would otherwise make the same one twice).
    mkdir -p "$dir/etc/node$i" "$dir/pmix/node$i"
    cp "$dir/slurm.conf" "$dir/etc/node$i/slurm.conf"
    echo "PMIxCliTmpDirBase=$dir/pmix/node$i" >"$dir/etc/node$i/mpi.conf"
    nsenter --net="/run/netns/${_slurm_tag}n$i" unshare --uts \
      sh -c "hostname node$i && exec slurmd -f '$dir/etc/node$i/slurm.conf' -N node$i" || return 1
  done
  # Ready when every node is idle.
  for i in $(seq 1 120); do
    [ "$(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)" -eq "$nodes" ] && return 0
    sleep 0.5
  done
  echo "slurm cluster: nodes did not become idle; sinfo says:" >&2
  sinfo -N -l >&2
  tail -n 20 "$dir"/log/*.log >&2
  return 1
}

slurm_cluster_stop() {
  [ -n "$_slurm_tag" ] || return 0
  local i pid
  if [ -n "$_slurm_dir" ]; then
    for pid in $(cat "$_slurm_dir"/spool/slurmd.*.pid "$_slurm_dir/slurmctld.pid" 2>/dev/null); do kill "$pid" 2>/dev/null; done
    sleep 1
    for pid in $(cat "$_slurm_dir"/spool/slurmd.*.pid "$_slurm_dir/slurmctld.pid" "$_slurm_dir/munge/munged.pid" 2>/dev/null); do
      kill -9 "$pid" 2>/dev/null
    done
  fi
  for i in $(seq 1 "$_slurm_nodes"); do
    # Whatever still runs in a node's namespace (job steps, orted) goes too.
    for pid in $(ip netns pids "${_slurm_tag}n$i" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    ip netns delete "${_slurm_tag}n$i" 2>/dev/null
    ip link delete "${_slurm_tag}v$i" 2>/dev/null
  done
  ip link delete "${_slurm_tag}br" 2>/dev/null
  _slurm_tag=""
}

# slurm_submit_wait SCRIPT [sbatch args...]: submits, waits (deadline $SLURM_TEST_DEADLINE, 300 s);
# $job is the job id, $rc the job's exit code (scontrol's ExitCode=code:signal; 128 + signal where
# killed), 124 past the deadline (the job is cancelled), sbatch's status where submitting failed.
# It polls the job's state every 0.2 s: `sbatch --wait` polls at intervals that grow to 10 s or more,
# which made jobs of a few seconds take up to 40 s.
slurm_submit_wait() {
  local script=$1
  shift
  local o state exit_code deadline=$((SECONDS + ${SLURM_TEST_DEADLINE:-300}))
  log=""
  o=$(sbatch --parsable "$@" "$script" 2>"$_slurm_dir/sbatch.err") || { rc=$? job=""; return; }
  job=${o%%;*}
  rc=124
  while [ $SECONDS -lt $deadline ]; do
    state=$(scontrol -o show job "$job" 2>/dev/null)
    case $(grep -o " JobState=[A-Z_]*" <<<"$state") in
      "" | *=PENDING | *=RUNNING | *=CONFIGURING | *=COMPLETING | *=SUSPENDED | *=REQUEUED | *=RESIZING | \
        *=SIGNALING | *=STAGE_OUT) ;;
      *)
        exit_code=$(grep -o " ExitCode=[0-9]*:[0-9]*" <<<"$state")
        exit_code=${exit_code# ExitCode=}
        if [ "${exit_code#*:}" != 0 ]; then rc=$((128 + ${exit_code#*:})); else rc=${exit_code%:*}; fi
        return ;;
    esac
    sleep 0.2
  done
  scancel "$job" 2>/dev/null
}

# slurm_test_begin: the start of a test script (after lib.sh): skips (exit 77, with the reason)
# where no cluster can be had; otherwise makes $tmp, starts a two-node cluster in it, and on exit
# stops the cluster and removes $tmp.
slurm_test_begin() {
  local reason
  reason=$(slurm_cluster_skip_reason)
  if [ -n "$reason" ]; then
    echo "SKIP - slurm cluster: $reason"
    exit 77
  fi
  tmp=$(mktemp -d /tmp/mpiddp-slurm-XXXXXX)
  chmod 755 "$tmp"
  trap '_slurm_test_end' EXIT
  trap 'exit 1' INT TERM
  if ! slurm_cluster_start "$tmp/cluster" 2; then
    echo "FAIL - the slurm cluster did not start"
    tail -n 30 "$tmp"/cluster/log/*.log
    exit 1
  fi
}
_slurm_test_end() {
  slurm_cluster_stop
  rm -rf "$tmp"
}
