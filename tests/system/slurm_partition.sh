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
reason=$(slurm_cluster_skip_reason)
if [ -n "$reason" ]; then
  echo "SKIP - slurm cluster: $reason"
  exit 77
fi
tmp=$(mktemp -d /tmp/mpiddp-slurm-XXXXXX)
chmod 755 "$tmp"
cleanup() {
  slurm_cluster_stop
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
if ! slurm_cluster_start "$tmp/cluster" 2; then
  echo "FAIL - the slurm cluster did not start"
  tail -n 30 "$tmp"/cluster/log/*.log
  exit 1
fi
timeout_s=10
export OMPI_MCA_btl_tcp_if_include=$SLURM_TEST_NET.0/24 OMPI_MCA_oob_tcp_if_include=$SLURM_TEST_NET.0/24
export OMPI_MCA_rmaps_base_oversubscribe=1 MPIDDP_COMM_TIMEOUT=$timeout_s MPIDDP_STALL_WARNING=4
"$mpiddp" data synthetic --samples 2048 --features 20 --seed 0 --out "$tmp/synthetic.h5" >/dev/null
cd "$tmp" || exit 1
train=(train --model linear --data "$tmp/synthetic.h5" --epochs 400 --batch-size 32 --optimizer sgd --lr 0.001
       --threads 1 --save-every 20)
{
  echo '#!/bin/bash'
  echo "#SBATCH -N 2 --ntasks-per-node=2 -o $tmp/%j.log"
  echo "exec mpirun --bind-to none \"$mpiddp\" ${train[*]} --snapshot-dir \"$tmp/run/snapshots\" --resume auto"
} >"$tmp/job.sh"
state_of() { scontrol show job "$1" 2>/dev/null | grep -o "JobState=[A-Z_]*" | cut -d= -f2; }

job=$(sbatch --parsable "$tmp/job.sh")
job=${job%%;*}
for _ in $(seq 1 600); do [ -n "$(readlink "$tmp/run/snapshots/latest.h5" 2>/dev/null)" ] && break; sleep 0.1; done
sleep 1
ip link set "${_slurm_tag}v2" down
cut_at=$(date +%s)
for _ in $(seq 1 $(( (timeout_s + 90) * 5 ))); do
  case $(state_of "$job") in PENDING | RUNNING | CONFIGURING | COMPLETING | "") sleep 0.2 ;; *) break ;; esac
done
ended=$(( $(date +%s) - cut_at ))
state=$(state_of "$job")
log=$(cat "$tmp/$job.log" 2>/dev/null)
check "partition: Slurm records the job as failed (state $state)" [ "$state" = FAILED ]
check "partition: the job ended within the timeout + 30 s of the cut (took $ended s)" [ "$ended" -le $((timeout_s + 30)) ]
check "partition: node1's ranks name node2's ranks as unreachable" \
  contains "did not complete within $timeout_s s: stalled: ranks 2,3 (not waiting in any collective" "$log"
[ "$state" = FAILED ] && [ "$ended" -le $((timeout_s + 30)) ] || { echo "       job log:"; tail -n 12 "$tmp/$job.log" | sed 's/^/       /'; }
ip link set "${_slurm_tag}v2" up
for _ in $(seq 1 100); do [ "$(sinfo -h -N -t idle -o %N | sort -u | wc -l)" -eq 2 ] && break; sleep 0.5; done

last=$(readlink "$tmp/run/snapshots/latest.h5")
check "partition: the last snapshot is intact" "$mpiddp" export "$tmp/run/snapshots/latest.h5" --out "$tmp/check.pt"
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
