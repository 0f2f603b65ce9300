#!/usr/bin/env bash
# A network partition on the two-node Slurm test cluster (slurm_cluster.sh): while a 4-rank job
# (2 per node) trains with snapshots, node2's link is cut (its veth set down). The job must end
# within MPIDDP_COMM_TIMEOUT + 30 s of the cut, its log naming the unreachable ranks; Slurm must
# record it as failed; the last snapshot must be intact, and a resubmission (link restored,
# --resume auto) must end with parameters bitwise equal to an uninterrupted run.
# Skips (exit 77, with the reason) where no cluster can be had.
# usage: slurm_partition.sh path/to/mpiddp
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/slurm_cluster.sh"
mpiddp=$1
slurm_test_begin
timeout_s=20
export OMPI_MCA_btl_tcp_if_include=$SLURM_TEST_NET.0/24 OMPI_MCA_oob_tcp_if_include=$SLURM_TEST_NET.0/24
export OMPI_MCA_rmaps_base_oversubscribe=1 MPIDDP_COMM_TIMEOUT=$timeout_s MPIDDP_STALL_WARNING=4
# mpirun learns that a node's daemon is gone from TCP keepalive on its idle control connection
# (Open MPI 4's defaults: 300 s idle + 9 probes x 20 s; batch/*.sh set 60 + 3 x 10 s, this test
# 5 + 3 x 2 s). It must come before the collective timeout: once mpiddp calls MPI_Abort, mpirun's
# abort message to the unreachable daemon keeps that connection busy, keepalive no longer
# applies, and mpirun waits for TCP's retransmissions (many minutes). mpiddp's stall warnings
# (every 4 s here, 60 s by default) name the stalled ranks before that.
export OMPI_MCA_oob_tcp_keepalive_time=5 OMPI_MCA_oob_tcp_keepalive_intvl=2 OMPI_MCA_oob_tcp_keepalive_probes=3
"$mpiddp" data synthetic --samples 2048 --features 20 --seed 0 --out "$tmp/synthetic.h5" >/dev/null
cd "$tmp" || exit 1
train=(train --model linear --data "$tmp/synthetic.h5" --epochs 400 --batch-size 32 --optimizer sgd --lr 0.001
       --threads 1 --save-every 20)
{
  echo '#!/bin/bash'
  echo "#SBATCH -N 2 --ntasks-per-node=2 -o $tmp/%j.log"
  echo "mpirun --bind-to none \"$mpiddp\" ${train[*]} --snapshot-dir \"$tmp/run/snapshots\" --resume auto"
  echo 'rc=$?; echo "mpirun ended at $(date +%s) with status $rc"; exit $rc'
} >"$tmp/job.sh"
state_of() { scontrol show job "$1" 2>/dev/null | grep -o "JobState=[A-Z_]*" | cut -d= -f2; }

job=$(sbatch --parsable "$tmp/job.sh")
job=${job%%;*}
for _ in $(seq 1 600); do [ -n "$(readlink "$tmp/run/snapshots/latest.h5" 2>/dev/null)" ] && break; sleep 0.1; done
sleep 1
ip link set "${_slurm_tag}v2" down
cut_at=$(date +%s)
# The batch script (on node1) ends when mpirun does; Slurm's own bookkeeping of node2's share of
# the job waits for node2's slurmd, so the job's final state is read after the link is back.
for _ in $(seq 1 $(( (timeout_s + 90) * 5 ))); do grep -q "^mpirun ended at" "$tmp/$job.log" 2>/dev/null && break; sleep 0.2; done
log=$(cat "$tmp/$job.log" 2>/dev/null)
end_at=$(grep -o "^mpirun ended at [0-9]*" <<<"$log" | grep -o "[0-9]*$")
ended=$(( ${end_at:-$((cut_at + 99999))} - cut_at ))
failed_before=$failed
check "partition: the job ended within the timeout + 30 s of the cut (took $ended s)" \
  [ "$ended" -ge 0 -a "$ended" -le $((timeout_s + 30)) ]
check "partition: with a non-zero status" contains "^mpirun ended at [0-9]* with status [1-9]" "$log"
check "partition: every node1 rank names ranks 2,3 as stalled" \
  bash -c 'for r in 0 1; do grep -q "^mpiddp: warning: \[rank $r\] .* stalled: ranks 2,3 (" <<<"$1" || exit 1; done' _ "$log"
check "partition: mpirun names the unreachable node" contains "Remote daemon: .* on node node2" "$log"
[ "$failed" -eq "$failed_before" ] || { echo "       job log (cut at $cut_at):"; grep -v "RANK\|^epoch" "$tmp/$job.log" | tail -n 30 | sed 's/^/       /'; }
ip link set "${_slurm_tag}v2" up
for _ in $(seq 1 300); do case $(state_of "$job") in PENDING | RUNNING | CONFIGURING | COMPLETING | "") sleep 0.2 ;; *) break ;; esac; done
state=$(state_of "$job")
check "partition: Slurm records the job as failed (state $state)" [ "$state" = FAILED ]
for _ in $(seq 1 100); do [ "$(sinfo -h -N -t idle -o %N | sort -u | wc -l)" -eq 2 ] && break; sleep 0.5; done

last=$(readlink "$tmp/run/snapshots/latest.h5")
"$mpiddp" export "$tmp/run/snapshots/latest.h5" --out "$tmp/check.pt" >/dev/null
check "partition: the last snapshot is intact (mpiddp export verifies it)" [ $? -eq 0 ]
job2=$(sbatch --parsable "$tmp/job.sh")
job2=${job2%%;*}
for _ in $(seq 1 1500); do case $(state_of "$job2") in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL) break ;; esac; sleep 0.2; done
log2=$(cat "$tmp/$job2.log" 2>/dev/null)
check "resubmission: completed" [ "$(state_of "$job2")" = COMPLETED ]
check "resubmission: resumed from the last snapshot ($last), no fallback" \
  bash -c 'grep -q "^Resuming training from snapshot" <<<"$1" && ! grep -q "falling back" <<<"$1"' _ "$log2"
run_np 4 "$mpiddp" "${train[@]}" --snapshot-dir "$tmp/reference"
check "resubmission: final parameters bitwise equal to an uninterrupted run" \
  h5diff -q "$tmp/run/snapshots/latest.h5" "$tmp/reference/latest.h5" /model /model
finish
