// Helpers for MPI tests. Contract: an assertion is made on a verdict all ranks share, so no rank
// returns early from a test and leaves the others inside a collective.
#pragma once

#include <mpiddp/process_group.hpp>
#include <mpiddp/runtime.hpp>

#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

namespace mpiddp::testing {

/// The process's Runtime, created by the MPI gtest main before any test runs.
Runtime& runtime();

/// A process group of `backend` in check mode (timeout 120 s), created on first use and kept until
/// the run ends (collective: every rank must ask for the same backends in the same order).
/// "mpi_staged" is the mpi group copying every tensor through host memory
/// (CommOptions::stage_through_host), the path CUDA tensors take without CUDA-aware MPI.
ProcessGroup& checked_group(const std::string& backend);

/// True on every rank iff `local` is true on every rank.
inline bool on_all_ranks(bool local) { return all_ok(runtime().world(), local); }

/// True on every rank iff every rank's libtorch has CUDA and the rank has a GPU.
inline bool cuda_on_all_ranks() { return on_all_ranks(torch::cuda::is_available() && runtime().device().is_cuda()); }

/// MPIDDP_REQUIRE_GPU=1 (scripts/gpu.sh sets it) turns a GPU case's skip into a failure, so a run
/// on the GPU machine cannot pass by skipping what it is there to prove.
inline bool gpu_required() {
  const char* v = std::getenv("MPIDDP_REQUIRE_GPU");
  return v != nullptr && std::string(v) == "1";
}

/// True on every rank iff no two ranks of a node have to share a GPU (NCCL's condition).
inline bool gpu_per_rank() { return on_all_ranks(runtime().local_size() <= runtime().visible_gpus()); }

/// Whether this binary has the nccl backend.
inline bool nccl_built() {
  const auto built = available_backends();
  return std::find(built.begin(), built.end(), "nccl") != built.end();
}

/// The groups that take CUDA tensors here: mpi always (CUDA-aware or staged through the host; ranks
/// may share a GPU), nccl where it is built and every rank has a GPU of its own.
inline std::vector<std::string> cuda_backends() {
  std::vector<std::string> backends = {"mpi"};
  if (gpu_per_rank() && nccl_built()) backends.emplace_back("nccl");
  return backends;
}

/// TF32 would round CUDA's float32 matrix products and convolutions to 10 bits: a GPU case compares
/// float32 with float32.
inline void float32_on_gpu() {
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setAllowTF32CuDNN(false);
}

}  // namespace mpiddp::testing

/// Skips the current test on every rank (or fails it, under MPIDDP_REQUIRE_GPU=1) unless every
/// rank can use CUDA.
#define MPIDDP_SKIP_WITHOUT_GPU()                                                                    \
  do {                                                                                               \
    if (!::mpiddp::testing::cuda_on_all_ranks()) {                                                   \
      if (::mpiddp::testing::gpu_required()) FAIL() << "MPIDDP_REQUIRE_GPU=1 but a rank has no GPU"; \
      GTEST_SKIP() << "needs a CUDA libtorch and a GPU on every rank";                               \
    }                                                                                                \
  } while (0)

/// Asserts `cond` on every rank after the ranks have agreed: fails everywhere if any rank failed.
#define MPIDDP_EXPECT_ALL(cond) EXPECT_TRUE(::mpiddp::testing::on_all_ranks(static_cast<bool>(cond))) << #cond
#define MPIDDP_ASSERT_ALL(cond) ASSERT_TRUE(::mpiddp::testing::on_all_ranks(static_cast<bool>(cond))) << #cond
