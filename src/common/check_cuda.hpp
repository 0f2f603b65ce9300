// Internal: check macros for CUDA and NCCL calls (only where MPIDDP_HAS_CUDA / MPIDDP_HAS_NCCL).
#pragma once

#include <mpiddp/config.hpp>
#include <mpiddp/error.hpp>

#include <string>

#if MPIDDP_HAS_CUDA
#include <cuda_runtime_api.h>

#define MPIDDP_CHECK_CUDA(call)                                                                                      \
  do {                                                                                                               \
    cudaError_t mpiddp_err_ = (call);                                                                                \
    if (mpiddp_err_ != cudaSuccess) {                                                                                \
      throw ::mpiddp::Error(                                                                                         \
          std::string(#call) + " failed: " + cudaGetErrorName(mpiddp_err_) + ": " + cudaGetErrorString(mpiddp_err_), \
          __FILE__, __LINE__);                                                                                       \
    }                                                                                                                \
  } while (0)
#endif

#if MPIDDP_HAS_NCCL
#include <nccl.h>

#define MPIDDP_CHECK_NCCL(call)                                                                                      \
  do {                                                                                                               \
    ncclResult_t mpiddp_res_ = (call);                                                                               \
    if (mpiddp_res_ != ncclSuccess && mpiddp_res_ != ncclInProgress) {                                               \
      throw ::mpiddp::Error(std::string(#call) + " failed: " + ncclGetErrorString(mpiddp_res_), __FILE__, __LINE__); \
    }                                                                                                                \
  } while (0)
#endif
