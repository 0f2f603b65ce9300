#!/usr/bin/env bash
# The GPU stage: everything the GPU proof needs, in one call on a GPU machine (the 'cuda' image of the H100/H200
# machines: PyTorch 2.11+cu130 with its NCCL wheel, the CUDA 13 toolkit, CMake and ninja; no MPI,
# HDF5, Boost or GoogleTest, and nothing outside it can be reached).
#
# Before, on a machine with Debian's archive: `bash scripts/gpu_debs.sh` (downloads the Debian 12
# packages and Fashion-MNIST into .gpu-debs/, ~57 MiB); carry .gpu-debs to the GPU machine. There:
#   bash scripts/gpu.sh [OUT_DIR] [STAGES]
# STAGES (comma-separated, default all): deps,build,tests,cli,train,launch,figures,profile
#   deps     unpack the packages into a prefix (system libraries win where the image has the soname)
#   build    mpiddp against the machine's libtorch (torch.utils.cmake_prefix_path) and NCCL, with
#            the GPU test entries (MPIDDP_GPU_TESTS=ON)
#   tests    the whole CTest suite with MPIDDP_REQUIRE_GPU=1: GPU cases fail instead of skipping
#            (GPU_SUITE=gpu: only the unit and MPI tests, which hold every GPU test case; the cli
#            stage checks info and bench on the GPU, and scripts/test.sh runs the system tests on
#            the CPU against the same torch wheel); then the GPU cases alone, `ctest -L gpu` (1 and
#            2 ranks), whose exit status is the GPU cases' verdict
#   cli      mpiddp info at 1 and 2 ranks; mpiddp bench --backend nccl -c 1 (1 rank), --backend mpi
#            --device cuda -c 1 (2 ranks sharing the GPU)
#   train    mpiddp train --device cuda --backend nccl --model cnn on Fashion-MNIST (>= 90% test
#            accuracy), a TorchScript model, bf16 and fp16 mixed precision; the CNN at 2 ranks sharing
#            the GPU resumed bitwise; the built-in GPT on CUDA (fp32, bf16) against its CPU run; ZeRO
#            stages 2 and 3 on CUDA at 2 ranks resumed bitwise; the GPT's own MFU in its record
#   launch   a torchrun-style DDP script under `mpiddp launch` with NCCL, equal to one process on the GPU
#   figures  samples/s on the GPU, side by side, ROUNDS rounds (env GPU_ROUNDS, default 3): mpiddp
#            (nccl, 1 rank) and Python PyTorch DDP (nccl, 1 rank, eager) for the CNN, a 20 M-parameter
#            MLP and torchvision's ResNet-18 (scripted for mpiddp); the GPT at GPT-2 small's shape
#            (bf16, micro-batch GPU_GPT_BATCH, default 16) against nanoGPT's under Python DDP, eager
#            and compiled, and llm.c's train_gpt2cu where carried and built (GPU_LLMC=0: not):
#            tokens/s, MFU (mpiddp's record's), whole-run seconds; DDP overhead over the same steps
#            without communication and the GPU time of the NCCL collectives per step, from CUDA
#            events (mpiddp_ddp_bench --device cuda)
#   profile  GPT-2 small on both sides under PyTorch's profiler (steps 20-22): profile.md, per step,
#            the GPU's busy and idle time, kernels by kind, the host's waits; GPU memory peaks; the
#            CNN's and the MLP's DDP steps against the same steps without communication, traced
# Where one command may run 10 minutes at most, two calls do it all, each on a fresh machine:
#   bash scripts/gpu.sh OUT deps,build,tests     and     bash scripts/gpu.sh OUT deps,build,cli,train,figures
# With less device time (15 minutes, starts included), one call does every GPU check and a round of
# figures: GPU_SUITE=gpu GPU_ROUNDS=1 bash scripts/gpu.sh OUT (timed before the figures gained nanoGPT
# compiled and llm.c: a compile of GPT-2 and an llm.c build more, not yet timed there; GPU_LLMC=0
# leaves llm.c out)
# (GPU_CTEST_JOBS, default nproc/2, sets the suite's parallelism; GPU_SUITE=none runs the gpu entries
# alone; GPU_ROUNDS the figures' rounds).
# A CPU rehearsal, on a machine without a GPU, against the same torch wheel (scripts/build_pip.sh's venv):
#   GPU_REHEARSAL=1 GPU_PYTHON=build-pip/venv/bin/python bash scripts/gpu.sh OUT deps,build,tests
# runs the same deps, build and test steps with GPU cases skipping instead of failing; every check
# that needs a GPU is reported SKIP, never PASS (the gpu entries are run there only to see each of
# them fail without a GPU). On a GPU machine only the GPU steps are then new.
# Writes into OUT_DIR eight files: profile.md, loss_kernels.jsonl, summary.txt (one line per check: PASS/FAIL), gpu.log (everything),
# tests.log (CTest: the suite, then the gpu entries), figures.jsonl and figures.md, logs.tgz (every other log); data, models and
# snapshots go to GPU_WORK (default /tmp/mpiddp-gpu). Exit status non-zero if any check failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${1:-${OUT:-gpu-out}}
stages=${2:-deps,build,tests,cli,train,launch,figures,profile}
rounds=${GPU_ROUNDS:-3}
gpt_batch=${GPU_GPT_BATCH:-16}
debs=${GPU_DEBS:-.gpu-debs}
prefix=${GPU_PREFIX:-/opt/mpiddp-deps}
build=${GPU_BUILD:-build-gpu}
work=${GPU_WORK:-/tmp/mpiddp-gpu}
mpiddp=$build/mpiddp
data=$work/data
mkdir -p "$out" "$work/logs"
out=$(cd "$out" && pwd)
logs=$work/logs
log=$out/gpu.log summary=$out/summary.txt
: >"$summary"
exec > >(tee -a "$log") 2>&1
py=${GPU_PYTHON:-python3}
rehearsal=${GPU_REHEARSAL:-0}
has() { [[ ",$stages," == *",$1,"* ]]; }
say() { echo "== $(date +%T) $*"; }
failures=0
result() {  # result NAME STATUS [DETAIL]
  local status=$2
  [ "$status" = PASS ] || failures=$((failures + 1))
  echo "$status $1${3:+ : $3}" | tee -a "$summary"
}
run_check() {  # run_check NAME command...: PASS when the command exits 0
  local name=$1
  shift
  if "$@"; then result "$name" PASS; else result "$name" FAIL "exit $?"; fi
}
gpu_check() {  # gpu_check NAME command...: run_check on a GPU machine; SKIP in a CPU rehearsal
  if [ "$rehearsal" = 1 ]; then echo "SKIP $1 : CPU rehearsal, no GPU" | tee -a "$summary"; else run_check "$@"; fi
}

# ---- environment: the prefix, torch, CUDA, NCCL ---------------------------------------------
usr=$prefix/usr
lib=$usr/lib/x86_64-linux-gnu
fallback_lib=$prefix/fallback/usr/lib/x86_64-linux-gnu
export OPAL_PREFIX=$usr PMIX_INSTALL_PREFIX=$lib/pmix2
export PATH=$usr/bin:$PATH
export LD_LIBRARY_PATH=$lib:$lib/openmpi/lib:$lib/hdf5/serial:$fallback_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none  # no CMA inside a VM
export PMIX_MCA_pcompress_base_silence_warning=1     # the prefix's PMIx finds no zlib plugin there
[ "$rehearsal" = 1 ] || export MPIDDP_REQUIRE_GPU=1

# ---- the stages, one function each (the dispatch at the end runs those asked for, in this order) ----

deps() {
  local f so name system link
  say "deps: unpacking $debs into $prefix"
  [ -d "$debs/core" ] || { result deps FAIL "no $debs/core: run scripts/gpu_debs.sh first and carry $debs"; exit 1; }
  rm -rf "$prefix" && mkdir -p "$prefix/fallback"
  for f in "$debs"/core/*.deb; do dpkg-deb -x "$f" "$prefix"; done
  for f in "$debs"/fallback/*.deb; do dpkg-deb -x "$f" "$prefix/fallback"; done
  # A fallback library whose soname the image already has gives way to the image's; a -dev link to
  # it is pointed at the image's copy.
  for so in "$fallback_lib"/*.so.*; do
    [ -f "$so" ] && [ ! -L "$so" ] || continue
    name=$(objdump -p "$so" 2>/dev/null | awk '/SONAME/ {print $2}')
    system=$(ldconfig -p | awk -v n="$name" '$1 == n && /x86-64/ {print $NF; exit}')
    [ -n "$name" ] && [ -n "$system" ] || continue
    for link in "$fallback_lib"/*.so; do
      [ "$(readlink -f "$link")" = "$(readlink -f "$so")" ] && ln -sf "$system" "$link"
    done
    rm -f "$fallback_lib/$name" "$so"
  done
  # Debian's update-alternatives makes these links at install time; dpkg-deb -x does not.
  for t in mpirun mpiexec mpicc mpicxx mpic++; do ln -sf "$t.openmpi" "$usr/bin/$t"; done
  # Fashion-MNIST where the tests and `mpiddp data` look for it.
  if [ -d "$debs/fashion-mnist" ]; then
    mkdir -p /usr/share/datasets && rm -rf /usr/share/datasets/fashion-mnist &&
      cp -r "$debs/fashion-mnist" /usr/share/datasets/fashion-mnist
  fi
  run_check "deps: mpirun runs 2 ranks from the prefix" timeout 60 mpirun --oversubscribe -n 2 true
}

build() {
  local zlib
  # scripts/build_pip.sh: the wheel's libtorch and NCCL, CUDA and the NCCL backend ON, the test
  # Python this one; the prefix's Open MPI, HDF5, Boost, GoogleTest and protobuf beside it.
  say "build: $build"
  # The image's libz.so.1 (Debian's static libz.a in the fallback prefix is not position-independent).
  zlib=$(ldconfig -p | awk '/libz\.so\.1 .*x86-64/ {print $NF; exit}')
  run_check "build: configure and compile against $py's torch (CUDA, NCCL ON)" env MPIDDP_PYTHON="$py" \
    MPIDDP_PREFIX_PATH="$usr" bash scripts/build_pip.sh "$build" -DCUDAToolkit_ROOT=/usr/local/cuda \
    -DMPI_C_COMPILER="$usr/bin/mpicc.openmpi" -DMPI_CXX_COMPILER="$usr/bin/mpicxx.openmpi" \
    -DHDF5_ROOT="$usr" -DHDF5_C_INCLUDE_DIR="$usr/include/hdf5/serial" \
    -DHDF5_hdf5_LIBRARY_RELEASE="$lib/hdf5/serial/libhdf5.so" -DProtobuf_PROTOC_EXECUTABLE="$usr/bin/protoc" \
    -DZLIB_ROOT="$prefix/fallback/usr" ${zlib:+-DZLIB_LIBRARY="$zlib"} -DCMAKE_UNITY_BUILD=ON -DMPIDDP_BUILD_TESTS=ON -DMPIDDP_GPU_TESTS=ON
  # (unity: a third less build time, as in scripts/test.sh)
}

tests() {
  local selection jobs rc entries summary_line
  say "tests: ctest ($([ "$rehearsal" = 1 ] && echo "CPU rehearsal: GPU cases skip" || echo MPIDDP_REQUIRE_GPU=1))"
  # Not the cluster tests: system.modules holds Makefile.llsc to the host's module system and Debian's
  # own Open MPI first on PATH, where here the prefix's comes first (scripts/test.sh runs it on Debian
  # 12); the Slurm ones would skip. The gpu entries run next, on their own.
  selection=(-LE '^(cluster|gpu)$')
  [ "${GPU_SUITE:-all}" = gpu ] && selection=(-L '^(unit|mpi)$')
  jobs=${GPU_CTEST_JOBS:-$(( $(nproc) / 2 ))}
  : >"$out/tests.log"
  if [ "${GPU_SUITE:-all}" != none ]; then  # none: the gpu entries alone (the CPU stages run the rest)
    ctest --test-dir "$build" --output-on-failure -j "$jobs" --timeout 1500 "${selection[@]}" >"$out/tests.log" 2>&1
    rc=$?
    grep -E "tests passed|tests failed|\*\*\*Failed|Not Run|\*\*\*Skipped|Timeout" "$out/tests.log"
    [ $rc -eq 0 ] && result "tests: suite (${GPU_SUITE:-all})" PASS "$(grep 'tests passed' "$out/tests.log")" ||
      result "tests: suite (${GPU_SUITE:-all})" FAIL "$(grep 'tests passed\|tests failed' "$out/tests.log")"
  fi
  # The GPU cases, run (not skipped) at 1 and 2 ranks: the entries labelled gpu (mpiddp_add_mpi_test:
  # the suites named *Cuda and GPU_CASES) set MPIDDP_REQUIRE_GPU=1, so a case without its GPU fails,
  # and an entry that selects no case fails; their verdict is ctest's exit status. Collectives on CUDA (nccl at 1 rank;
  # mpi staged or CUDA-aware), DDP on CUDA equal to one process, ZeRO 1 and 2 on CUDA equal to stage 0
  # and the GPT on CUDA following its CPU run.
  entries=$(ctest --test-dir "$build" -N -L '^gpu$' | awk '/Total Tests:/ {print $3}')
  run_check "tests: gpu entries registered (MPIDDP_GPU_TESTS=ON): ${entries:-0}" [ "${entries:-0}" -gt 0 ]
  echo "== ctest -L gpu" >>"$out/tests.log"
  ctest --test-dir "$build" --output-on-failure -j "$jobs" --timeout 1500 -L '^gpu$' >>"$out/tests.log" 2>&1
  rc=$?
  summary_line=$(grep 'tests passed\|tests failed' "$out/tests.log" | tail -n 1)
  if [ "$rehearsal" = 1 ]; then
    # Without a GPU every entry must fail: none may pass by skipping what it is there to prove.
    run_check "tests: without a GPU every gpu entry fails, none passes by skipping" \
      grep -q "^0% tests passed" <<<"$summary_line"
    echo "SKIP tests: GPU cases, ctest -L gpu : CPU rehearsal, no GPU" | tee -a "$summary"
  elif [ $rc -eq 0 ]; then
    result "tests: GPU cases, ctest -L gpu (1 and 2 ranks)" PASS "$summary_line"
  else
    result "tests: GPU cases, ctest -L gpu (1 and 2 ranks)" FAIL "$summary_line"
  fi
}

# The data of the stages after tests (made once, kept in GPU_WORK).
prepare_data() {
  mkdir -p "$data"
  [ -f "$data/fm-train.h5" ] || "$mpiddp" data fashion-mnist --out "$data/fm" >/dev/null
  # Token shards (bytes) of this repository's own text, for the GPT: ~0.6 MB, llm.c's format.
  [ -f "$data/text_train_000001.bin" ] || "$mpiddp" data text --in README.md docs/*.md src/*/*.cpp src/*/*.hpp \
    include/mpiddp/*.hpp --out "$data/text" >/dev/null
}

cli() {
  local n
  say "cli: info, bench"
  for n in 1 2; do
    mpirun --oversubscribe -n "$n" "$mpiddp" info >"$logs/info.np$n.txt" 2>&1
    cat "$logs/info.np$n.txt"
    run_check "info np$n: OK" [ "$(tail -n 1 "$logs/info.np$n.txt")" = OK ]
    run_check "info np$n: a named GPU on every rank" [ "$(grep -c " GPU : .*GiB, compute" "$logs/info.np$n.txt")" -eq "$n" ]
    run_check "info np$n: CUDA-aware MPI said" grep -q "CUDA-aware MPI: \(yes\|no\)" "$logs/info.np$n.txt"
  done
  mpirun --oversubscribe -n 1 "$mpiddp" bench --backend nccl -c 1 -b 8 -e 256M -f 4 --collective all \
    --json "$logs/bench_nccl.json" >"$logs/bench_nccl.txt" 2>&1
  cat "$logs/bench_nccl.txt"
  run_check "bench --backend nccl -c 1, 1 rank: 0 wrong" grep -q "Out of bounds values : 0 OK" "$logs/bench_nccl.txt"
  mpirun --oversubscribe -n 2 "$mpiddp" bench --backend mpi --device cuda -c 1 -b 8 -e 64M -f 8 --collective all \
    >"$logs/bench_mpi_cuda.txt" 2>&1
  cat "$logs/bench_mpi_cuda.txt"
  run_check "bench --backend mpi --device cuda -c 1, 2 ranks on one GPU: 0 wrong" \
    grep -q "Out of bounds values : 0 OK" "$logs/bench_mpi_cuda.txt"
}

last_epoch() { $py -c 'import json,sys; print([x for x in map(json.loads, open(sys.argv[1])) if x.get("kind") == "epoch"][-1][sys.argv[2]])' "$1" "$2"; }
accuracy() { last_epoch "$1" test_accuracy; }
at_least() { $py -c 'import sys; sys.exit(0 if float(sys.argv[1]) >= float(sys.argv[2]) else 1)' "$1" "$2"; }
# resume_check NAME DIR STEP ARGS...: `mpiddp ARGS` at 2 ranks whole (snapshots in DIR-ref), then
# again resumed from its step-STEP snapshot (in DIR); PASS when both end bitwise equal (model,
# optimizer, RNG).
resume_check() {
  local name=$1 snap=$2 step=$3 first
  shift 3
  first=snapshot-step$(printf %010d "$step").h5
  rm -rf "$snap" "$snap-ref"
  mpirun --oversubscribe -n 2 "$mpiddp" "$@" --snapshot-dir "$snap-ref" >/dev/null
  mkdir -p "$snap" && cp "$snap-ref/$first" "$snap/"
  mpirun --oversubscribe -n 2 "$mpiddp" "$@" --snapshot-dir "$snap" --resume "$snap/$first" >/dev/null
  run_check "$name: resumed from step $step, final state bitwise equal (model, optimizer, RNG)" \
    bash -c 'for g in /model /optimizer /rng; do h5diff -q "$1" "$2" $g $g || exit 1; done' _ \
    "$snap-ref/latest.h5" "$snap/latest.h5"
}
within() { $py -c 'import sys; a, b, t = map(float, sys.argv[1:]); sys.exit(0 if abs(a - b) <= t * abs(b) else 1)' "$1" "$2" "$3"; }
# The built-in GPT (nanoGPT's by name and numbers) on the token shards: the shape and AdamW of
# bench/lm_bench.sh, nanoGPT's decay groups and clipping; gpt2 is GPT-2 small's shape (124 M).
gpt_small=(--model gpt --n-layer 4 --n-head 4 --n-embd 256 --block-size 128 --vocab-size 256)
gpt2=(--model gpt --n-layer 12 --n-head 12 --n-embd 768 --block-size 1024 --vocab-size 50304)
# shellcheck disable=SC2054  # --betas takes "0.9,0.95"
gpt_run=(--data "$data/text_train_000001.bin" --epochs 1000 --optimizer adamw --lr 1e-3 --betas 0.9,0.95
         --weight-decay 0.1 --weight-decay-params matrices --clip-grad-norm 1.0)

train() {
  local m acc p ref got
  local -a common
  say "train: Fashion-MNIST on the GPU"
  m=$logs/train_cnn.jsonl
  rm -f "$m"
  mpirun --oversubscribe -n 1 "$mpiddp" train --device cuda --backend nccl --model cnn --data "$data/fm-train.h5" \
    --test-data "$data/fm-test.h5" --epochs 4 --batch-size 64 --lr 0.002 --lr-schedule cosine --metrics "$m"
  acc=$(accuracy "$m" 2>/dev/null || echo 0)
  run_check "train cnn --device cuda --backend nccl: test accuracy $acc >= 0.90" at_least "$acc" 0.90
  # Two ranks sharing the GPU through the mpi backend, snapshots, exact resume.
  # --deterministic: cuDNN's convolution backward otherwise picks kernels that add in any order.
  resume_check "train cnn cuda np2 (mpi)" "$work/snap" 40 train --device cuda --backend mpi --model cnn --deterministic \
    --data "$data/fm-train.h5" --epochs 2 --batch-size 64 --max-steps 120 --save-every-steps 40 --keep 0 \
    --optimizer adam --lr 0.001
  # A TorchScript model and mixed precision.
  $py bench/python_ddp.py --model cnn --save-script "$work/cnn.pt" --seed 0
  m=$logs/train_script.jsonl
  rm -f "$m"
  mpirun --oversubscribe -n 1 "$mpiddp" train --device cuda --backend nccl --model "$work/cnn.pt" \
    --data "$data/fm-train.h5" --test-data "$data/fm-test.h5" --epochs 2 --batch-size 64 --lr 0.001 --metrics "$m"
  acc=$(accuracy "$m" 2>/dev/null || echo 0)
  run_check "train TorchScript cnn on cuda: test accuracy $acc >= 0.88" at_least "$acc" 0.88
  for p in bf16 fp16; do
    m=$logs/train_$p.jsonl
    rm -f "$m"
    mpirun --oversubscribe -n 1 "$mpiddp" train --device cuda --backend nccl --model cnn --precision "$p" \
      --data "$data/fm-train.h5" --test-data "$data/fm-test.h5" --epochs 2 --batch-size 64 --lr 0.002 --metrics "$m"
    acc=$(accuracy "$m" 2>/dev/null || echo 0)
    run_check "train cnn --precision $p on cuda: test accuracy $acc >= 0.88" at_least "$acc" 0.88
  done
  # The GPT on CUDA against its CPU run (same seed, data and 300 steps; the CPU suite proves that run
  # equal to nanoGPT's): the final test loss within 2% (fp32) and 5% (bf16 autocast), and learned
  # (below 60% of a uniform guess's ln 256 = 5.55).
  common=(train "${gpt_small[@]}" "${gpt_run[@]}" --test-data "$data/text_val_000000.bin" --batch-size 16
          --max-steps 300 --log-every 0)
  m=$logs/gpt_cpu.jsonl
  rm -f "$m"
  mpirun --oversubscribe -n 1 --bind-to none "$mpiddp" "${common[@]}" --device cpu --backend mpi \
    --threads "$(( $(nproc) / 2 ))" --metrics "$m" >/dev/null
  ref=$(last_epoch "$m" test_loss 2>/dev/null || echo nan)
  run_check "train gpt on cpu (the reference): test loss $ref <= 3.33" at_least 3.33 "$ref"
  for p in fp32:0.02 bf16:0.05; do
    m=$logs/gpt_cuda_${p%:*}.jsonl
    rm -f "$m"
    mpirun --oversubscribe -n 1 "$mpiddp" "${common[@]}" --device cuda --backend nccl --precision "${p%:*}" \
      --metrics "$m" >/dev/null
    got=$(last_epoch "$m" test_loss 2>/dev/null || echo nan)
    run_check "train gpt --device cuda --precision ${p%:*}: test loss $got within ${p#*:} of the CPU run's $ref" \
      within "$got" "$ref" "${p#*:}"
  done
  # MFU in mpiddp's own record (issue 41): the bf16 run's epoch line carries flops_per_s and mfu, the
  # latter flops_per_s over the H100's/H200's dense bf16 peak (989 TFLOP/s, one rank).
  run_check "train gpt --precision bf16: its record's mfu is flops_per_s / 989 TFLOP/s" $py - "$logs/gpt_cuda_bf16.jsonl" <<'PY'
import json, sys
e = [x for x in map(json.loads, open(sys.argv[1])) if x.get("kind") == "epoch"][-1]
print(f"flops_per_s {e['flops_per_s']:.4g}, mfu {e['mfu']:.4f}")
assert 0 < e["mfu"] < 1 and abs(e["mfu"] - e["flops_per_s"] / 989e12) <= 1e-9 * e["mfu"]
PY
  # ZeRO stage 2 on CUDA: 2 ranks sharing the GPU (mpi group), snapshots of the gathered optimizer
  # state every 20 steps, a run resumed from step 20 ends bitwise where the whole run ends.
  resume_check "train gpt --zero-stage 2 cuda np2 (mpi)" "$work/zsnap" 20 train "${gpt_small[@]}" "${gpt_run[@]}" \
    --batch-size 8 --grad-accum 2 --max-steps 60 --save-every-steps 20 --keep 0 --device cuda --backend mpi \
    --zero-stage 2 --log-every 0
  # ZeRO stage 3 with activation checkpointing, the same way.
  resume_check "train gpt --zero-stage 3 --activation-checkpointing cuda np2 (mpi)" "$work/z3snap" 20 train \
    "${gpt_small[@]}" "${gpt_run[@]}" --batch-size 8 --grad-accum 2 --max-steps 60 --save-every-steps 20 --keep 0 \
    --device cuda --backend mpi --zero-stage 3 --activation-checkpointing --log-every 0
}

launch() {
  say "launch: a torchrun-style script under mpiddp launch, NCCL"
  # A torchrun-style DDP script under `mpiddp launch` with NCCL on the GPU (1 rank: NCCL refuses two
  # ranks on one GPU) equals one process on the global batch.
  mpirun --oversubscribe -n 1 "$mpiddp" launch -- $py tests/python/torchrun_ddp.py "$work/launch.json" --nccl
  $py tests/python/torchrun_ddp.py "$work/launch_ref.json" --reference 1 --nccl  # on the GPU too
  run_check "launch -- python torchrun_ddp.py --nccl (cuda): the parameters of one process (1e-5)" $py - \
    "$work/launch.json" "$work/launch_ref.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a.keys() == b.keys(), (a.keys(), b.keys())
d = max(abs(x - y) for k in a for x, y in zip(a[k], b[k]))
print(f"launch vs one process: max |difference| {d:.3g}")
assert d <= 1e-5
PY
}

# llm.c's train_gpt2cu built from the source gpu_debs.sh carried ($debs/llm.c, fetched from GitHub on
# the machine that made it, never part of this repository; with CUDA 13's nvcc it compiles on a CPU
# machine, and links where a driver's NVML is): one GPU, no MPI or NCCL, no cuDNN (its
# cuDNN attention needs the cudnn-frontend headers, which are not on the machine). Sets llmc to the
# binary, or to nothing where it is not carried or does not build (said in the summary).
llmc_build() {
  local src=$debs/llm.c dst=$work/llm.c cc nvcc nvml
  llmc=
  if [ "${GPU_LLMC:-1}" = 0 ]; then
    echo "SKIP figures: llm.c : GPU_LLMC=0" | tee -a "$summary"
    return 0
  fi
  if [ ! -f "$src/train_gpt2.cu" ]; then
    echo "SKIP figures: llm.c : not carried ($src; scripts/gpu_debs.sh with GPU_LLMC_GIT)" | tee -a "$summary"
    return 0
  fi
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d .)
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  rm -rf "$dst" && cp -r "$src" "$dst"
  # CUDA 13's cudaMemAdvise takes a cudaMemLocation where llm.c (written for CUDA 12) passes a device
  # id, in its out-of-memory fallback only: that one argument is adapted, nothing else.
  if [ "$("$nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')" -ge 13 ] 2>/dev/null; then
    sed -i 's/cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})/' \
      "$dst/llmc/cuda_utils.cuh"
  fi
  # It links the driver's NVML (-lnvidia-ml), which a driver installs as libnvidia-ml.so.1 only.
  nvml=$( (ldconfig -p 2>/dev/null | awk '/libnvidia-ml\.so\.1 / && /x86-64/ {print $NF; exit}'; ls /usr/local/nvidia/lib64/libnvidia-ml.so.1 \
    /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 2>/dev/null) | head -n 1)
  mkdir -p "$dst/lib"
  [ -z "$nvml" ] || ln -sf "$nvml" "$dst/lib/libnvidia-ml.so"
  if make -C "$dst" train_gpt2cu NO_MULTI_GPU=1 NO_USE_MPI=1 USE_CUDNN=0 GPU_COMPUTE_CAPABILITY="${cc:-90}" \
    NVCC="$nvcc" NVCC_LDLIBS="-L$dst/lib" >"$logs/llmc-build.log" 2>&1; then
    result "figures: llm.c $(cat "$src/COMMIT" 2>/dev/null) built (sm_${cc:-90}, no cuDNN)" PASS
    llmc=$dst/train_gpt2cu
  else
    result "figures: llm.c built" FAIL "$(grep -m 1 -i 'error' "$logs/llmc-build.log")"
  fi
}

# GPT-2 small, bf16, 60 steps of GPU_GPT_BATCH (16) x 1024 tokens, one rank, each contender in turn:
# tokens/s of the steps after the first 10 and the whole run's seconds, start-up included, as the user
# waits for it. mpiddp: its log lines' windows 11-20 .. 51-60. nanoGPT's GPT under Python DDP, eager
# and compiled (torch.compile, nanoGPT's default; its compilation falls in the first 10 steps): its
# clock from step 10, synchronised. llm.c (where built): its steps after step 10 over the sum of their
# times (each step timed by CUDA events). MFU: this script owns no FLOP formula or peak. mpiddp's row carries the mfu (and flops_per_s) of
# mpiddp's own record, over the same windows, where mpiddp knows the device's peak; for one model on
# one device MFU is proportional to tokens/s (bench/report.py derives the others'). Rows: ROUND, WHO,
# the micro-batch.
gpt2_round() {
  local r=$1 fig=$2 m t0 t1 mode
  m=$logs/fig.mpiddp.gpt2.$r.jsonl
  rm -f "$m"
  t0=$(date +%s.%N)
  mpirun --oversubscribe -n 1 "$mpiddp" train "${gpt2[@]}" "${gpt_run[@]}" --batch-size "$gpt_batch" --max-steps 60 \
    --device cuda --backend nccl --precision bf16 --log-every 10 --metrics "$m" >/dev/null
  t1=$(date +%s.%N)
  $py -c 'import json, statistics, sys
w = [x for x in map(json.loads, open(sys.argv[1])) if x.get("kind") == "log"][1:]
row = {"round": int(sys.argv[2]), "model": "gpt2", "who": "mpiddp", "batch": int(sys.argv[5]),
       "tokens_per_s": statistics.median(x["tokens_per_s"] for x in w), "seconds": float(sys.argv[4]) - float(sys.argv[3])}
row.update({k: statistics.median(x[k] for x in w) for k in ("mfu", "flops_per_s") if w and all(k in x for x in w)})
print(json.dumps(row))' "$m" "$r" "$t0" "$t1" "$gpt_batch" >>"$fig" ||
    result "figures: mpiddp gpt2 round $r" FAIL
  for mode in eager compiled; do
    m=$logs/fig.nanogpt-$mode.gpt2.$r.jsonl
    t0=$(date +%s.%N)
    mpirun --oversubscribe -n 1 -x MASTER_PORT=2956$r $py bench/python_gpt_ddp.py "$data/text_train_000001.bin" 60 \
      12 12 768 1024 "$gpt_batch" 1 --device cuda --backend nccl --precision bf16 --vocab 50304 --timed-from 10 \
      $([ $mode = compiled ] && echo --compile) >"$m"
    t1=$(date +%s.%N)
    $py -c 'import json, sys
r = json.loads(open(sys.argv[1]).readlines()[-1])
print(json.dumps({"round": int(sys.argv[2]), "model": "gpt2", "who": sys.argv[5], "batch": int(sys.argv[6]),
                  "tokens_per_s": r["tokens_per_s"], "params": r["params"], "seconds": float(sys.argv[4]) - float(sys.argv[3])}))' \
      "$m" "$r" "$t0" "$t1" "nanogpt-$mode" "$gpt_batch" >>"$fig" || result "figures: nanogpt-$mode gpt2 round $r" FAIL
  done
  [ -n "$llmc" ] || return 0
  m=$logs/fig.llmc.gpt2.$r.txt
  t0=$(date +%s.%N)
  # Random init (-e d12); validation at the first and the last step, over one batch of the training
  # shard (llm.c's loader needs a shard of a step's tokens); no sampling, HellaSwag or checkpoints.
  (cd "$work/llm.c" && "$llmc" -i "$data/text_train_000001.bin" -j "$data/text_train_000001.bin" -e d12 \
    -b "$gpt_batch" -t 1024 -d $((gpt_batch * 1024)) -x 60 -v 100000 -m 1 -s 0 -h 0 -n 0) >"$m" 2>&1
  t1=$(date +%s.%N)
  $py -c 'import json, re, sys
ms = [float(t) for s, t in re.findall(r"^step\s+(\d+)/\d+ \|.*\| ([0-9.]+) ms \|", open(sys.argv[1]).read(), re.M) if int(s) > 10]
print(json.dumps({"round": int(sys.argv[2]), "model": "gpt2", "who": "llm.c", "batch": int(sys.argv[5]),
                  "tokens_per_s": int(sys.argv[5]) * 1024 * 1000 * len(ms) / sum(ms),
                  "seconds": float(sys.argv[4]) - float(sys.argv[3])}))' "$m" "$r" "$t0" "$t1" "$gpt_batch" >>"$fig" ||
    result "figures: llm.c gpt2 round $r" FAIL "$(tail -n 1 "$m")"
}

figures() {
  local fig r model mm batch m gpu_name
  say "figures: $rounds round(s)"
  llmc_build
  fig=$out/figures.jsonl
  : >"$fig"
  $py bench/python_ddp.py --model mlp_wide --save-script "$work/mlp_wide.pt" --seed 0
  $py bench/python_ddp.py --model resnet18 --save-script "$work/resnet18.pt" --seed 0
  for r in $(seq 1 "$rounds"); do
    for model in cnn mlp_wide resnet18; do
      case $model in
        cnn) mm=cnn batch=64 ;;
        mlp_wide) mm=$work/mlp_wide.pt batch=256 ;;
        resnet18) mm=$work/resnet18.pt batch=128 ;;
      esac
      m=$logs/fig.mpiddp.$model.$r.jsonl
      rm -f "$m"
      mpirun --oversubscribe -n 1 "$mpiddp" train --device cuda --backend nccl --model "$mm" \
        --data "$data/fm-train.h5" --epochs 2 --batch-size "$batch" --lr 0.001 --optimizer adam --metrics "$m" >/dev/null
      $py -c 'import json,sys; r=[x for x in map(json.loads, open(sys.argv[1])) if x.get("kind") == "epoch"][-1]; print(json.dumps({"round": int(sys.argv[2]), "model": sys.argv[3], "who": "mpiddp", "samples_per_s": r["samples_per_s"]}))' \
        "$m" "$r" "$model" >>"$fig" || result "figures: mpiddp $model round $r" FAIL
      m=$logs/fig.python.$model.$r.jsonl
      mpirun --oversubscribe -n 1 -x MASTER_PORT=2955$r $py bench/python_ddp.py --device cuda --backend nccl \
        --model "$model" --data "$data/fm-train.h5" --epochs 2 --batch-size "$batch" --lr 0.001 --optimizer adam >"$m"
      $py -c 'import json,sys; r=json.loads(open(sys.argv[1]).readlines()[-1]); print(json.dumps({"round": int(sys.argv[2]), "model": sys.argv[3], "who": "python", "samples_per_s": r["samples_per_s"]}))' \
        "$m" "$r" "$model" >>"$fig" || result "figures: python $model round $r" FAIL
    done
    gpt2_round "$r" "$fig"
    for model in cnn mlp; do
      mpirun --oversubscribe -n 1 "$build/bench/mpiddp_ddp_bench" --model "$model" --device cuda --backend nccl \
        --steps 50 --rounds 6 --warmup 10 --batch 64 | sed "s/^{/{\"round\": $r, \"who\": \"ddp_bench\", /" >>"$fig"
    done
  done
  gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
  # The tables (bench/report.py: the same rules scripts/figures.py quotes in docs/gpu.md).
  $py bench/report.py --gpu "$gpu_name" "$fig" | tee "$out/figures.md"
}

profile() {
  local who sampler model
  # GPT-2 small (bf16, 16 x 1024 tokens a step), mpiddp and nanoGPT's GPT under Python DDP, each
  # profiled (PyTorch's profiler, Chrome traces into logs.tgz) over steps 20-22, every step's time
  # logged (mpiddp) and the GPU's memory sampled (nvidia-smi): where a step's time goes on each side.
  say "profile: GPT-2 small, bf16, steps 20-22 of 40"
  for who in mpiddp python; do
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 250 >"$logs/profile.$who.memory" 2>/dev/null &
    sampler=$!
    if [ "$who" = mpiddp ]; then
      mpirun --oversubscribe -n 1 "$mpiddp" train "${gpt2[@]}" "${gpt_run[@]}" --batch-size 16 --max-steps 40 \
        --device cuda --backend nccl --precision bf16 --log-every 1 --metrics "$logs/profile.mpiddp.jsonl" \
        --profile "$logs/profile.mpiddp.json" --profile-from 20 --profile-steps 3 >"$logs/profile.mpiddp.txt" 2>&1
    else
      mpirun --oversubscribe -n 1 -x MASTER_PORT=29570 $py bench/python_gpt_ddp.py "$data/text_train_000001.bin" 40 \
        12 12 768 1024 16 1 --device cuda --backend nccl --precision bf16 --vocab 50304 --timed-from 10 \
        --profile "$logs/profile.python.json" --profile-from 20 --profile-steps 3 >"$logs/profile.python.txt" 2>&1
    fi
    run_check "profile: $who GPT-2 small, steps 20-22 traced" [ -s "$logs/profile.$who.rank0.json" ]
    kill "$sampler" 2>/dev/null
    echo "$who: GPU memory used, peak $(sort -n "$logs/profile.$who.memory" | tail -n 1) MiB" | tee -a "$out/profile.md"
  done
  $py bench/profile_summary.py --top 15 3 mpiddp="$logs/profile.mpiddp.rank0.json" python="$logs/profile.python.rank0.json" |
    tee -a "$out/profile.md"
  $py -c 'import json, sys
for x in map(json.loads, open(sys.argv[1])):
    if x.get("kind") == "log": print(x.get("global_step"), round(x.get("tokens_per_s", 0)))' \
    "$logs/profile.mpiddp.jsonl" | tr '\n' ' ' | sed 's/^/mpiddp tokens\/s by step: /' | tee -a "$out/profile.md"
  echo | tee -a "$out/profile.md"
  gzip -f "$logs"/profile.*.rank*.json
  # DDP's overhead on millisecond steps: 50 steps of the CNN and of the MLP with DDP (nccl, 1 rank)
  # and the same steps without communication, each traced: where the DDP step's extra time goes.
  for model in cnn mlp; do
    mpirun --oversubscribe -n 1 "$build/bench/mpiddp_ddp_bench" --model "$model" --device cuda --backend nccl \
      --steps 50 --rounds 2 --warmup 10 --batch 64 --profile "$logs/profile.ddp-$model" >>"$logs/profile.ddp.jsonl"
    run_check "profile: DDP and local steps of the $model traced" \
      test -s "$logs/profile.ddp-$model.ddp.rank0.json" -a -s "$logs/profile.ddp-$model.local.rank0.json"
    echo "DDP step of the $model (50 steps, 1 rank, batch 64) against the same steps without communication:" |
      tee -a "$out/profile.md"
    $py bench/profile_summary.py --top 10 50 ddp="$logs/profile.ddp-$model.ddp.rank0.json" \
      local="$logs/profile.ddp-$model.local.rank0.json" | tee -a "$out/profile.md"
    echo | tee -a "$out/profile.md"
  done
  gzip -f "$logs"/profile.ddp-*.rank*.json
  # The loss three ways at the same shape (bench/loss_kernels.py): what a bfloat16 loss would save.
  $py bench/loss_kernels.py | tee "$out/loss_kernels.jsonl"
  run_check "profile: the loss three ways timed" [ -s "$out/loss_kernels.jsonl" ]
}

# ---- dispatch ---------------------------------------------------------------------------------
has deps && deps
say "torch $($py -c 'import torch; print(torch.__version__, torch.version.cuda)'); $py"
nvidia-smi -L || true
has build && build
[ -x "$mpiddp" ] || { result "build: $mpiddp exists" FAIL; exit 1; }
has tests && tests
prepare_data
for stage in cli train launch figures profile; do
  has "$stage" && "$stage"
done

tar czf "$out/logs.tgz" -C "$work" logs
say "summary"
cat "$summary"
echo "$failures check(s) failed"
[ "$failures" -eq 0 ]
