// Internal: the backend factories, one per file pair (mpi_backend.cpp, nccl_backend.cpp,
// gloo_backend.cpp). Each is compiled only when its library is found.
#pragma once

#include <mpiddp/config.hpp>
#include <mpiddp/process_group.hpp>

#include <memory>

namespace mpiddp::detail {

std::unique_ptr<ProcessGroup> make_mpi_group(const Runtime& runtime, const CommOptions& options);
#if MPIDDP_HAS_NCCL
std::unique_ptr<ProcessGroup> make_nccl_group(const Runtime& runtime, const CommOptions& options);
#endif
#if MPIDDP_HAS_GLOO
std::unique_ptr<ProcessGroup> make_gloo_group(const Runtime& runtime, const CommOptions& options);
#endif

}  // namespace mpiddp::detail
