#!/usr/bin/env bash
# End-to-end: `mpiddp info` through the real executable, alone and under mpiexec at 1..4 ranks.
# usage: info_cli.sh path/to/mpiddp
source "$(dirname "$0")/lib.sh"
mpiddp=$1
host=$(hostname)
nccl_flag=()
[[ " $MPIEXEC_FLAGS " == *" --oversubscribe "* ]] && nccl_flag=(-x NCCL_DEBUG=INFO)  # Open MPI
export NCCL_DEBUG=INFO NCCL_SOCKET_IFNAME=lo

run_alone "$mpiddp" info
check "singleton: exit 0" [ "$rc" -eq 0 ]
check "singleton: '<host>: 0 of 1'" [ "$(count_lines "$host: 0 of 1" "$out")" -eq 1 ]
check "singleton: ends in OK" [ "$(last_line "$out")" = OK ]
# GPUs this build can use: nvidia-smi's count where mpiddp was built with CUDA, else none.
gpus=0
if contains "^  CUDA      : runtime" "$out" && command -v nvidia-smi >/dev/null; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU ")
fi

for n in 1 2 3 4; do
  run_np "$n" "${nccl_flag[@]}" "$mpiddp" info
  check "np$n: exit 0" [ "$rc" -eq 0 ]
  check "np$n: one '<host>: r of $n' line per rank" [ "$(grep -c -E "^$host: [0-9]+ of $n\$" <<<"$out")" -eq "$n" ]
  for ((r = 0; r < n; r++)); do
    check "np$n: rank $r, in order, with LOCAL_RANK $r" \
      line_after "$host: $r of $n" "$host LOCAL_RANK : $r" "$out"
  done
  check "np$n: GROUP_RANK 0 on every rank" [ "$(count_lines "$host GROUP_RANK : 0" "$out")" -eq "$n" ]
  check "np$n: LOCAL_WORLD_SIZE $n" [ "$(count_lines "$host LOCAL_WORLD_SIZE : $n" "$out")" -eq "$n" ]
  check "np$n: NCCL_DEBUG shown per rank" [ "$(count_lines "$host NCCL_DEBUG : INFO" "$out")" -eq "$n" ]
  check "np$n: NCCL_SOCKET_IFNAME shown per rank" [ "$(count_lines "$host NCCL_SOCKET_IFNAME : lo" "$out")" -eq "$n" ]
  if [ "$gpus" -eq 0 ]; then
    check "np$n: device cpu" [ "$(count_lines "$host DEVICE : cpu" "$out")" -eq "$n" ]
    check "np$n: no GPU, said per rank" [ "$(count_lines "$host GPU : none" "$out")" -eq "$n" ]
  else  # ranks take GPUs round-robin by local rank
    check "np$n: a CUDA device per rank" [ "$(grep -c -x "$host DEVICE : cuda:[0-9]*" <<<"$out")" -eq "$n" ]
    check "np$n: the GPU of every rank, named" \
      [ "$(grep -c -x "$host GPU : .* ([0-9.]* GiB, compute [0-9.]*, PCI .*, GPU-[0-9a-f-]*)" <<<"$out")" -eq "$n" ]
  fi
  check "np$n: CUDA-aware MPI said" contains "^  CUDA-aware MPI: \(yes\|no\|unknown\)$" "$out"
  check "np$n: versions" contains "MPI       : " "$out"
  check "np$n: ends in one OK" [ "$(last_line "$out")" = OK ]
done

run_np 3 "$mpiddp" info --json
check "json: exit 0" [ "$rc" -eq 0 ]
check "json: parses, 3 ranks in order, OK" python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
assert d["result"] == "OK" and d["world_size"] == 3, d
assert [r["RANK"] for r in d["ranks"]] == [0, 1, 2]
assert [r["LOCAL_RANK"] for r in d["ranks"]] == [0, 1, 2]
assert all(r["GROUP_RANK"] == 0 and r["LOCAL_WORLD_SIZE"] == 3 for r in d["ranks"])
assert all(c["ok"] for c in d["sanity_check"]["checks"])
assert d["ranks"][0]["versions"]["mpi"].strip()
assert d["ranks"][0]["versions"]["mpi_cuda_aware"] in ("yes", "no", "unknown")
assert all(("gpu" in r) and ((r["gpu"] is None) == (r["device"] == "cpu")) for r in d["ranks"])
' <<<"$out"

run_np 3 "$mpiddp" info --inject-fault 1
check "fault: non-zero exit, no hang" failed_cleanly
check "fault: ends in FAILED" [ "$(last_line "$out")" = FAILED ]
check "fault: names the wrong checks" contains "WRONG on rank(s) 0 1 2" "$out"

run_np 3 "$mpiddp" info --json --inject-fault 2
check "fault json: non-zero exit" failed_cleanly
check "fault json: result FAILED" python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); assert d["result"]=="FAILED"' <<<"$out"

SLURM_NTASKS=4 run_alone "$mpiddp" info
check "srun without PMI: non-zero exit" failed_cleanly
check "srun without PMI: one-line error naming SLURM_NTASKS=4" one_line "$err"
check "srun without PMI: says singletons" contains "SLURM_NTASKS=4.*singletons" "$err"

run_np 2 "$mpiddp" info --bogus
check "unknown option: non-zero exit, no hang" failed_cleanly
check "unknown option: one line from rank 0 for all ranks" one_line "$err"
check "unknown option: no per-rank repeats" [ "$(grep -c "unrecognised" <<<"$err")" -eq 1 ]
check "unknown option: names the option" contains "mpiddp info: error: unrecognised option '--bogus'" "$err"

run_np 2 "$mpiddp" info --inject-fault notanumber
check "bad value: non-zero exit" failed_cleanly
check "bad value: one-line error" one_line "$err"

run_np 2 "$mpiddp" frobnicate
check "unknown command: non-zero exit" failed_cleanly
check "unknown command: one-line error" one_line "$err"
check "unknown command: named" contains "unknown command 'frobnicate'" "$err"

run_np 2 "$mpiddp" info --help
check "help: exit 0" [ "$rc" -eq 0 ]
check "help: printed once" [ "$(grep -c '^usage:' <<<"$out")" -eq 1 ]

# The build is the stack the test Python's torch is (Debian's python3-torch, the chroot's, the pip
# venv's): the same libtorch version; CUDA kernels exactly when that torch has CUDA, for the same CUDA;
# and where that torch has NCCL, the nccl backend on the very NCCL library it loads. A build against
# PyTorch's CUDA wheel that dropped CUDA or NCCL, or linked a second NCCL, fails here.
run_alone "$mpiddp" info --json
json=$out
check "stack: libtorch, its CUDA and NCCL are the test Python's torch's ($(py -c 'import torch; print(torch.__version__)'))" \
  py - "$mpiddp" "$json" <<'PY'
import json, os, re, subprocess, sys, torch
mpiddp, info = sys.argv[1], json.loads(sys.argv[2])
v = info["ranks"][0]["versions"]
release = lambda text: re.match(r"[0-9.]*[0-9]", text).group(0)  # "2.11.0+cu130", "1.13.0a0" -> the numbers
assert release(v["libtorch"]) == release(torch.__version__), (v["libtorch"], torch.__version__)
assert v["libtorch_cuda"] == torch.version.cuda, ("mpiddp's libtorch CUDA", v["libtorch_cuda"], "torch's", torch.version.cuda)
if torch.version.cuda and torch.distributed.is_nccl_available():
    want = ".".join(map(str, torch.cuda.nccl.version()))
    assert "nccl" in v["backends"] and v["nccl"].startswith(want + " "), ("nccl", v["nccl"], "torch's", want)
    loaded = {l.split()[-1] for l in open("/proc/self/maps") if "/libnccl.so" in l}  # torch's, loaded on import
    linked = re.findall(r"libnccl\.so\S* => (\S+)", subprocess.run(["ldd", mpiddp], capture_output=True, text=True).stdout)
    assert len(loaded) == 1 and [os.path.realpath(p) for p in linked] == [os.path.realpath(p) for p in loaded], (linked, loaded)
PY

run_alone "$mpiddp" --version
check "version" contains "^mpiddp [0-9]\+\.[0-9]\+\.[0-9]\+$" "$out"

finish
