#!/usr/bin/env bash
# The batch scripts on a real two-node Slurm cluster started on this machine (slurm_cluster.sh:
# munged, slurmctld, two slurmd in their own network and UTS namespaces; MPI between the nodes
# over TCP). Checks: batch/batch.sh (`sbatch -N 2`): distinct hostnames per node, LOCAL_RANK /
# GROUP_RANK / WORLD_SIZE, the sanity check OK, training; a cross-node all-reduce checked by
# `mpiddp bench -c 1` (batch/bench.sh); batch/cpu.sh on 2 nodes gives the parameters of the same
# world size on one node; batch/srun.sh (srun --mpi=pmix); batch/python.sh (a torchrun-style DDP
# script under `mpiddp launch`, node1's address chosen on the nodes' subnet); batch/preempt.sh stopped by SIGUSR1,
# requeued, resumed from its snapshot. Skips (exit 77, with the reason) where no cluster can be had.
# usage: slurm_jobs.sh path/to/mpiddp path/to/make_bad_datasets SOURCE_DIR
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/slurm_cluster.sh"
mpiddp=$1 make_bad=$2 src=$3
slurm_test_begin
check "cluster: two idle nodes" [ "$(sinfo -h -N -t idle -o %N | sort -u | tr '\n' ' ')" = "node1 node2 " ]
# mpirun's lost-node keepalive (docs/cluster.md): Slurm runs a copy of each script, which cannot
# source a file beside it, so every script that runs mpirun carries batch.sh's three lines.
keepalive=$(grep '^export OMPI_MCA_oob_tcp_keepalive_' "$src/batch/batch.sh")
check "batch.sh: sets mpirun's keepalive time, interval and probes" [ "$(grep -c . <<<"$keepalive")" -eq 3 ]
for f in "$src"/batch/*.sh; do
  grep -q '^ *mpirun ' "$f" || continue
  check "$(basename "$f"): mpirun's keepalive as batch.sh's" [ "$(grep '^export OMPI_MCA_oob_tcp_keepalive_' "$f")" = "$keepalive" ]
done

# What every job gets (sbatch exports the environment): a module "mpiddp" for this build (the
# scripts `source /etc/profile`, which resets PATH, then `module load $MPIDDP_MODULES`), Open MPI's
# consent to run as root, and the namespaces' network for MPI between the nodes.
mkdir -p "$tmp/modules/mpiddp"
printf '#%%Module1.0\nprepend-path PATH %s\n' "$(cd "$(dirname "$mpiddp")" && pwd)" >"$tmp/modules/mpiddp/build"
export MODULEPATH=$tmp/modules MPIDDP_MODULES=mpiddp
export OMPI_MCA_btl_tcp_if_include=$SLURM_TEST_NET.0/24 OMPI_MCA_oob_tcp_if_include=$SLURM_TEST_NET.0/24
export OMPI_MCA_rmaps_base_oversubscribe=1
data=$tmp/data
mkdir -p "$data"
"$make_bad" "$tmp" >/dev/null
have_fm=0
if [ -f "$tmp/fm-small.h5" ]; then
  cp "$tmp/fm-small.h5" "$data/fashion-mnist-train.h5"
  cp "$tmp/fm-small.h5" "$data/fashion-mnist-test.h5"
  have_fm=1
fi
"$mpiddp" data synthetic --samples 2048 --features 20 --seed 0 --out "$data/synthetic.h5" >/dev/null
cd "$tmp" || exit 1
job_log() { cat "$tmp/$job.log" 2>/dev/null; }
job_completed() {  # job_completed NAME: the last job ended with status 0 (else its log's end is shown)
  check "$1: job completed" [ "$rc" -eq 0 ]
  [ "$rc" -eq 0 ] || { echo "       job $job ended with status $rc; its log ends:"; tail -n 25 "$tmp/$job.log" 2>&1 | sed 's/^/       /'; }
}

# ---- batch.sh: the SuperCloud job on 2 nodes x 2 ranks, on CPUs ---------------------------------
if [ $have_fm = 1 ]; then
  MPIDDP_DEVICE=cpu MPIDDP_DATA_DIR=$data MPIDDP_RUN_DIR=$tmp/run-batch MPIDDP_EPOCHS=2 \
    slurm_submit_wait "$src/batch/batch.sh" -N 2 --gres=none
  out=$(job_log)
  job_completed "batch.sh"
  check "batch.sh: one line per rank, hostnames per node" bash -c '
    for want in "node1: 0 of 4" "node1: 1 of 4" "node2: 2 of 4" "node2: 3 of 4"; do grep -q "$want\$" <<<"$1" || exit 1; done' _ "$out"
  check "batch.sh: LOCAL_RANK 0 1 0 1" [ "$(grep -o "node[12] LOCAL_RANK : [0-9]" <<<"$out" | tr '\n' ' ')" = "node1 LOCAL_RANK : 0 node1 LOCAL_RANK : 1 node2 LOCAL_RANK : 0 node2 LOCAL_RANK : 1 " ]
  check "batch.sh: GROUP_RANK 0 0 1 1" [ "$(grep -o "node[12] GROUP_RANK : [0-9]" <<<"$out" | tr '\n' ' ')" = "node1 GROUP_RANK : 0 node1 GROUP_RANK : 0 node2 GROUP_RANK : 1 node2 GROUP_RANK : 1 " ]
  check "batch.sh: WORLD_SIZE 4 on every rank" [ "$(grep -c "node[12] WORLD_SIZE : 4$" <<<"$out")" -eq 4 ]
  check "batch.sh: 2 nodes in the info header" contains "info: 4 ranks on 2 nodes" "$out"
  check "batch.sh: sanity check OK" contains "OK$" "$out"
  check "batch.sh: trained 2 epochs and evaluated" contains "epoch 2: train loss [0-9.]*, test loss [0-9.]*, test accuracy" "$out"
  check "batch.sh: snapshot written" [ -f "$tmp/run-batch/snapshots/latest.h5" ]
else
  echo "SKIP - batch.sh: Fashion-MNIST (dataset-fashion-mnist) is missing"
fi

# ---- a cross-node all-reduce checked element by element -----------------------------------------
MPIDDP_BACKEND=mpi MPIDDP_BENCH_ARGS="-b 8 -e 1M -f 32 -w 1 -n 3" slurm_submit_wait "$src/batch/bench.sh" -N 2 --gres=none
job_completed "bench.sh"
check "bench.sh: every collective across the nodes, no wrong element" py - "$tmp/mpiddp-bench-$job" <<'PY'
import json, sys, os
for c in ("allreduce", "allgather", "reduce_scatter", "alltoall", "broadcast"):
    d = json.load(open(os.path.join(sys.argv[1], c + ".json")))
    rows = d["results"]
    assert d["world_size"] == 4 and d["node_count"] == 2 and rows, c
    assert d["wrong"] == 0 and d["result"] == "OK", c
    assert all(r[k]["wrong"] == 0 for r in rows for k in ("out_of_place", "in_place")), c
PY

# ---- cpu.sh on 2 nodes = the same world size on one node ----------------------------------------
MPIDDP_DATA_DIR=$data MPIDDP_RUN_DIR=$tmp/run-cpu MPIDDP_EPOCHS=5 slurm_submit_wait "$src/batch/cpu.sh" -N 2
out=$(job_log)
job_completed "cpu.sh"
check "cpu.sh: the seeds' line from ranks on both nodes" [ "$(grep -c "Epoch 5 | Batchsize: 32 | Steps: 16" <<<"$out")" -eq 4 ]
run_np 4 "$mpiddp" train --model linear --data "$data/synthetic.h5" --device cpu --backend mpi --epochs 5 \
  --batch-size 32 --optimizer sgd --lr 0.001 --snapshot-dir "$tmp/one-node" --save-every 10
check "cpu.sh: same parameters as 4 ranks on one node" h5diff -q "$tmp/run-cpu/snapshots/latest.h5" "$tmp/one-node/latest.h5" /model /model

# ---- srun.sh: direct launch through PMIx ----------------------------------------------------------
if srun --mpi=list 2>&1 | grep -q pmix; then
  MPIDDP_DATA_DIR=$data MPIDDP_RUN_DIR=$tmp/run-srun MPIDDP_EPOCHS=3 slurm_submit_wait "$src/batch/srun.sh" -N 2
  out=$(job_log)
  job_completed "srun.sh"
  check "srun.sh: four ranks on two nodes" contains "info: 4 ranks on 2 nodes" "$out"
  check "srun.sh: trained" [ "$(grep -c "Epoch 3 | Batchsize: 32 | Steps: 16" <<<"$out")" -eq 4 ]
else
  echo "SKIP - srun.sh: this Slurm has no pmix plugin (srun --mpi=list)"
fi

# ---- python.sh: a torchrun-style DDP script under `mpiddp launch` on 2 nodes x 2 ranks -------------
same_params() {  # same_params A.json B.json: every parameter within 1e-5
  py - "$1" "$2" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert max(abs(x - y) for k in a for x, y in zip(a[k], b[k])) <= 1e-5
PY
}
MPIDDP_PYTHON=$TEST_PYTHON MPIDDP_LAUNCH_ARGS=--print-env MPIDDP_SCRIPT="$src/tests/python/torchrun_ddp.py $tmp/python-ddp.json" \
  slurm_submit_wait "$src/batch/python.sh" -N 2 --gres=none
out=$(job_log)
job_completed "python.sh"
check "python.sh: GROUP_RANK 0 0 1 1 on node1 node1 node2 node2" bash -c '
  for want in "node1 RANK=0 .* GROUP_RANK=0 " "node1 RANK=1 .* GROUP_RANK=0 " "node2 RANK=2 .* GROUP_RANK=1 " "node2 RANK=3 .* GROUP_RANK=1 "; do
    grep -q "$want" <<<"$1" || { echo "       no line \"$want\" among:"; echo "$1"; exit 1; }
  done' _ "$(cat "$tmp/python-ddp.json".rank*)"
check "python.sh: every rank dials node1's address on the nodes' subnet" \
  [ "$(grep -o "MASTER_ADDR=[^ ]*" <<<"$out" | sort | uniq -c | awk '{print $1, $2}')" = "4 MASTER_ADDR=$SLURM_TEST_NET.11" ]
py "$src/tests/python/torchrun_ddp.py" "$tmp/python-ref.json" --reference 4
check "python.sh: parameters equal one process on the global batch (1e-5)" same_params "$tmp/python-ddp.json" "$tmp/python-ref.json"

if srun --mpi=list 2>&1 | grep -q pmix; then
  MPIDDP_LAUNCHER=srun MPIDDP_PYTHON=$TEST_PYTHON MPIDDP_SCRIPT="$src/tests/python/torchrun_ddp.py $tmp/srun-ddp.json" \
    slurm_submit_wait "$src/batch/python.sh" -N 2 --gres=none
  job_completed "python.sh under srun --mpi=pmix"
  check "python.sh under srun: the same parameters" same_params "$tmp/srun-ddp.json" "$tmp/python-ref.json"
  check "python.sh under srun: GROUP_RANK 0 0 1 1" [ "$(cat "$tmp/srun-ddp.json".rank* | grep -o "GROUP_RANK=[01]" | tr '\n' ' ')" = "GROUP_RANK=0 GROUP_RANK=0 GROUP_RANK=1 GROUP_RANK=1 " ]
fi

# ---- preempt.sh: SIGUSR1 -> snapshot -> requeue -> resume -----------------------------------------
# The signal is sent at the first epoch's snapshot; 40 epochs (about 0.3 s each here) leave the first
# run some 10 s before it would end.
job=$(MPIDDP_DATA_DIR=$data MPIDDP_RUN_DIR=$tmp/run-pre MPIDDP_EPOCHS=40 sbatch --parsable -N 2 "$src/batch/preempt.sh")
job=${job%%;*}
for _ in $(seq 1 600); do [ -f "$tmp/run-pre/snapshots/latest.h5" ] && break; sleep 0.1; done
scancel --signal=USR1 "$job"
final=""
for _ in $(seq 1 900); do
  state=$(scontrol show job "$job" 2>/dev/null | grep -o "JobState=[A-Z_]*")
  restarts=$(scontrol show job "$job" 2>/dev/null | grep -o "Restarts=[0-9]*")
  # A requeued job may start again once its first run's credential has expired (Reason=BeginTime),
  # 11 s in the test cluster, at the scheduler's next pass (slurm_cluster.sh). Forcing an earlier
  # start (scontrol update StartTime=now) fails: slurmd still holds the old credential revoked and
  # refuses the launch, and the job ends FAILED.
  # Around a requeue the job passes through other states; only the requeued run's end counts.
  if [ "$restarts" != "Restarts=0" ] && [ "$state" = JobState=COMPLETED ]; then final=$state; break; fi
  sleep 0.2
done
out=$(job_log)
if [ "$final" != JobState=COMPLETED ]; then
  echo "preempt.sh: job $job did not complete after a requeue; scontrol and the job's output:"
  scontrol show job "$job" 2>&1 | sed 's/^/    /'
  tail -n 25 "$tmp/$job.log" 2>&1 | sed 's/^/    /'
fi
check "preempt.sh: the signal stopped training at a snapshot" contains "^stopped by SIGUSR1 at global step [0-9]*" "$out"
check "preempt.sh: the job requeued itself" contains "requeueing job $job" "$out"
check "preempt.sh: the requeued job resumed from the snapshot" contains "^Resuming training from snapshot at Epoch [0-9]" "$out"
check "preempt.sh: ... and completed" [ "$final" = "JobState=COMPLETED" ]
check "preempt.sh: ... all 40 epochs" contains "^epoch 40: " "$out"
finish
