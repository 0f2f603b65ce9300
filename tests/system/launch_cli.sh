#!/usr/bin/env bash
# `mpiddp launch` runs torchrun-style Python scripts, unchanged, from MPI alone (the test Python:
# Debian's, the chroot's or the pip venv's torch): a DDP script (gloo, env://, DistributedSampler)
# at 1-4 ranks equals one process on the global batch (1e-5) with either store host; the env
# contract each rank gets; a SuperCloud-style hello world; a rank that fails or dies ends the job
# with its status and leaves nothing running; SIGUSR1 (through mpirun) and SIGTERM (to the launchers,
# as scancel) reach every child; bad input in
# one line. usage: launch_cli.sh MPIDDP_BINARY
source "$(dirname "$0")/lib.sh"
mpiddp=$1
here=$(cd "$(dirname "$0")/../python" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
MPIDDP_TEST_DEADLINE=60
cores=$(nproc)
alive() { local f; for f in "$@"; do kill -0 "$(cat "$f")" 2>/dev/null && return 0; done; return 1; }
# gone_soon PIDFILE...: every one of those processes has ended within 5 s (mpirun may return while
# the kernel still delivers the last SIGTERM to a command whose launcher it killed).
gone_soon() { local i; for i in $(seq 50); do alive "$@" || return 0; sleep 0.1; done; return 1; }
same_params() {  # same_params A.json B.json: every parameter within 1e-5
  py - "$1" "$2" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a.keys() == b.keys()
d = max(abs(x - y) for k in a for x, y in zip(a[k], b[k]))
assert d <= 1e-5, d
PY
}

# ---- a torchrun-style DDP script equals one process on the global batch --------------------------
for n in 1 2 3 4; do
  run_np "$n" "$mpiddp" launch -- "$TEST_PYTHON" "$here/torchrun_ddp.py" "$tmp/ddp$n.json"
  check "ddp np$n: exit 0" [ "$rc" -eq 0 ]
  py "$here/torchrun_ddp.py" "$tmp/ref$n.json" --reference "$n"
  check "ddp np$n: parameters equal one process on the global batch (1e-5)" same_params "$tmp/ddp$n.json" "$tmp/ref$n.json"
  threads=$((cores / n)); [ $threads -ge 1 ] || threads=1
  want=""
  for r in $(seq 0 $((n - 1))); do
    want+="RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n GROUP_RANK=0 GROUP_WORLD_SIZE=1 ROLE_RANK=$r ROLE_WORLD_SIZE=$n OMP_NUM_THREADS=$threads"$'\n'
  done
  check "ddp np$n: each rank told its rank, node-local rank, node and threads" \
    [ "$(cat "$tmp/ddp$n.json".rank* | grep -o 'RANK=.*')" = "${want%$'\n'}" ]
done
# torchrun's agent store: the workers' env:// joins the launcher's. Where this torch is 2.x without
# libuv (Debian's), its agent-store client still asks for libuv and fails, under torchrun too.
if py - <<'PY'
import torch.distributed as d
try:
    d.TCPStore("127.0.0.1", 0, 1, True, use_libuv=True)
except TypeError:
    pass  # a torch from before libuv: its one store is the classic one
PY
then
  run_np 2 "$mpiddp" launch --store launcher -- "$TEST_PYTHON" "$here/torchrun_ddp.py" "$tmp/agent.json"
  check "--store launcher (torchrun's agent store): exit 0" [ "$rc" -eq 0 ]
  check "--store launcher: the same parameters" same_params "$tmp/agent.json" "$tmp/ref2.json"
else
  echo "SKIP - --store launcher: this torch has no libuv, which its agent-store client asks for"
fi

OMP_NUM_THREADS=3 run_np 2 "$mpiddp" launch --print-env -- "$TEST_PYTHON" "$here/supercloud_hello.py"
check "SuperCloud's hello world: exit 0" [ "$rc" -eq 0 ]
check "SuperCloud's hello world: each rank of 2, all-reduced" \
  [ "$(grep -o -E "$(hostname): [01] of 2, all_reduce 2" <<<"$out" | sort -u | wc -l)" -eq 2 ]  # ranks' lines may interleave
check "--print-env: rank 0 prints both ranks in order" \
  [ "$(grep -o '^rank [0-9] ([^)]*): RANK=[0-9]' <<<"$out" | tr '\n' ' ')" = "rank 0 ($(hostname)): RANK=0 rank 1 ($(hostname)): RANK=1 " ]
check "--print-env: one port, the loopback on one node, no agent store" bash -c '
  [ "$(grep -o "MASTER_ADDR=[^ ]* MASTER_PORT=[0-9]*" <<<"$1" | sort -u | wc -l)" -eq 1 ] &&
  grep -q "MASTER_ADDR=127.0.0.1 " <<<"$1" && ! grep -q TORCHELASTIC_USE_AGENT_STORE <<<"$1"' _ "$out"
check "an OMP_NUM_THREADS the job sets is kept" [ "$(grep -o "OMP_NUM_THREADS=3 " <<<"$out" | wc -l)" -eq 2 ]
check "--print-env: USE_LIBUV=0 for both ranks (Debian's torch 2.x has no libuv)" [ "$(grep -o "USE_LIBUV=0" <<<"$out" | wc -l)" -eq 2 ]

# ---- a failing or dying rank ends the job with its status, nothing left running ------------------
start=$SECONDS
run_np 3 "$mpiddp" launch -- "$TEST_PYTHON" "$here/launch_worker.py" fail "$tmp" 1 3
check "rank 1 exits 3: the job exits 3" [ "$rc" -eq 3 ]
check "rank 1 exits 3: ended within 20 s (the others would sleep 120 s)" [ $((SECONDS - start)) -le 20 ]
check "rank 1 exits 3: named" contains "mpiddp launch: error: rank 1 ($(hostname)): '.*launch_worker.py fail .* 1 3' exited with status 3" "$err"
check "rank 1 exits 3: all 3 workers had started" [ "$(ls "$tmp"/rank*.pid | wc -l)" -eq 3 ]
check "rank 1 exits 3: no worker left running (within 5 s)" gone_soon "$tmp"/rank*.pid
rm -f "$tmp"/rank*.pid
start=$SECONDS
run_np 3 "$mpiddp" launch -- "$TEST_PYTHON" "$here/launch_worker.py" kill "$tmp" 2
check "rank 2 killed by SIGKILL: the job exits 137" [ "$rc" -eq 137 ]
check "rank 2 killed: ended within 20 s" [ $((SECONDS - start)) -le 20 ]
check "rank 2 killed: named" contains "rank 2 .* was killed by signal 9" "$err"
check "rank 2 killed: all 3 workers had started" [ "$(ls "$tmp"/rank*.pid | wc -l)" -eq 3 ]
check "rank 2 killed: no worker left running (within 5 s)" gone_soon "$tmp"/rank*.pid

# ---- SIGUSR1 (a preemption notice) and SIGTERM reach every child ----------------------------------
mkdir "$tmp/sig"
start_bg 2 "$mpiddp" launch -- "$TEST_PYTHON" "$here/launch_worker.py" signals "$tmp/sig"
for _ in $(seq 150); do [ -f "$tmp/sig/rank0.ready" ] && [ -f "$tmp/sig/rank1.ready" ] && break; sleep 0.2; done
mpirun_pid=$(pgrep -P "$bg" | head -1)
kill -USR1 "$mpirun_pid"
for _ in $(seq 50); do [ -f "$tmp/sig/rank0.SIGUSR1" ] && [ -f "$tmp/sig/rank1.SIGUSR1" ] && break; sleep 0.2; done
check "SIGUSR1 to mpirun reaches both commands" all_exist "$tmp/sig/rank0.SIGUSR1" "$tmp/sig/rank1.SIGUSR1"
commands() {  # the Python commands (not their launchers, mpirun or timeout) whose line mentions $1
  local pid n=0
  for pid in $(pgrep -f -- "$1"); do [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == python* ]] && n=$((n + 1)); done
  echo $n
}
check "after SIGUSR1 both commands go on" [ "$(commands "launch_worker.py signals $tmp/sig")" -eq 2 ]
# SIGTERM to every launcher, as scancel signals every task (mpirun's own answer to a SIGTERM is
# Open MPI's: 4 passes it on, 5 and later's prterun may kill at once).
for pid in $(pgrep -f -- "launch_worker.py signals $tmp/sig"); do
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = mpiddp ] && kill -TERM "$pid"  # the launchers, not mpirun
done
wait_bg
check "SIGTERM to the launchers reaches both commands" all_exist "$tmp/sig/rank0.SIGTERM" "$tmp/sig/rank1.SIGTERM"
check "SIGTERM: the job ended, not timed out" not_timed_out
check "SIGTERM handled by the commands (exit 0): the job exits 0" [ "$rc" -eq 0 ]
check "SIGTERM: no command left running" fails pgrep -f "launch_worker.py signals $tmp/sig"

# ---- bad input: one line, a non-zero exit on every rank, no hang ----------------------------------
run_np 2 "$mpiddp" launch
check "no command: exit 2" [ "$rc" -eq 2 ]
check "no command: one line" one_line "$err"
check "no command: says so" contains "mpiddp launch: error: no command to run" "$err"
run_np 2 "$mpiddp" launch --store nowhere -- true
check "unknown --store: exit 2" [ "$rc" -eq 2 ]
check "unknown --store: one line" one_line "$err"
run_np 2 "$mpiddp" launch -- "$tmp/no-such-command" x
check "a command not found: exit 127" [ "$rc" -eq 127 ]
check "a command not found: one line" one_line "$err"
check "a command not found: says why" contains "cannot run '$tmp/no-such-command': No such file or directory$" "$err"
printf 'not a program\n' >"$tmp/not-executable"
start=$SECONDS
# shellcheck disable=SC2086
timeout -k 5 "$MPIDDP_TEST_DEADLINE" "$MPIEXEC" $MPIEXEC_FLAGS -n 1 "$mpiddp" launch -- sleep 30 : \
  -n 1 "$mpiddp" launch -- "$tmp/not-executable" >"$tmp/o" 2>"$tmp/e"
rc=$? err=$(cat "$tmp/e")
check "a command that cannot start on rank 1 only: exit 127" [ "$rc" -eq 127 ]
check "... one line" one_line "$err"
check "... naming rank 1" contains "cannot run .*not-executable.: Permission denied \[rank 1\]$" "$err"
check "... rank 0's started command ended with it (no 30 s wait)" [ $((SECONDS - start)) -le 15 ]
SLURM_NTASKS=2 run_alone "$mpiddp" launch -- true
check "srun without PMI: non-zero exit" failed_cleanly
check "srun without PMI: one line" one_line "$err"
finish
