// The backend table (backends.hpp): the one place that knows which backends this build has.
#include <mpiddp/backends.hpp>
#include <mpiddp/error.hpp>

#include <torch/cuda.h>

#include "comm/backend_factories.hpp"

namespace mpiddp {

const std::vector<BackendSpec>& backends() {
  static const std::vector<BackendSpec> table = {
    {"mpi", "MPI: CPU tensors, and CUDA tensors through CUDA-aware MPI or staged through the host", true, true, true,
     c10::kCPU, detail::make_mpi_group},
#if MPIDDP_HAS_NCCL
    {"nccl", "NCCL: CUDA tensors, communicator from rank 0's ncclUniqueId sent by MPI_Bcast", true, false, true,
     c10::kCUDA, detail::make_nccl_group},
#else
    {"nccl", "NCCL: CUDA tensors (not built: needs CUDA and NCCL)", false, false, true, c10::kCUDA, nullptr},
#endif
#if MPIDDP_HAS_GLOO
    {"gloo", "libtorch's c10d Gloo: CPU tensors, its store bootstrapped over MPI", true, true, false, c10::kCPU,
     detail::make_gloo_group},
#else
    {"gloo", "libtorch's c10d Gloo: CPU tensors (not built: needs libtorch's Gloo headers)", false, true, false,
     c10::kCPU, nullptr},
#endif
  };
  return table;
}

const BackendSpec* find_backend(const std::string& name) {
  for (const auto& b : backends()) {
    if (b.name == name) return &b;
  }
  return nullptr;
}

std::vector<std::string> available_backends() {
  std::vector<std::string> names;
  for (const auto& b : backends()) {
    if (b.built) names.push_back(b.name);
  }
  return names;
}

std::string backend_names(const std::string& separator, bool built_only) {
  std::string names;
  for (const auto& b : backends()) {
    if (b.built || !built_only) names += (names.empty() ? "" : separator) + b.name;
  }
  return names;
}

void check_backend(const std::string& name, c10::Device device, const Runtime& runtime, const std::string& what) {
  const auto* b = find_backend(name);
  MPIDDP_CHECK(b && b->built,
               "backend '" + name + "' is not built into this mpiddp (available: " + backend_names("|", true) + ")");
  if (device.is_cuda()) {
    MPIDDP_CHECK(b->takes_cuda, "--backend " + name + " goes with --device cpu");
    MPIDDP_CHECK(torch::cuda::is_available() && runtime.device().is_cuda(),
                 what + ": this rank has no GPU, or this libtorch has no CUDA");
  } else {
    MPIDDP_CHECK(b->takes_cpu, "--backend " + name + " goes with --device cuda");
  }
}

std::unique_ptr<ProcessGroup> make_process_group(const std::string& backend, const Runtime& runtime,
                                                 const CommOptions& options) {
  const auto* b = find_backend(backend);
  MPIDDP_CHECK(b && b->built,
               "backend '" + backend + "' is not built into this mpiddp (available: " + backend_names("|", true) + ")");
  return b->make(runtime, options);
}

}  // namespace mpiddp
