// What `mpiddp info` reports: library versions, NCCL variables, and a collective sanity check.
#pragma once

#include <mpiddp/runtime.hpp>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mpiddp {

/// Versions of the libraries this build uses, as each library reports them at run time
/// (compile-time versions in parentheses where they can differ). Empty when not built.
struct LibraryVersions {
  std::string mpiddp;
  std::string mpi;           ///< MPI_Get_library_version, first line
  std::string mpi_standard;  ///< MPI_Get_version, e.g. "3.1"
  std::string torch;
  std::string torch_cuda;    ///< the CUDA version libtorch's own kernels were built for; empty for a CPU-only libtorch
  std::string nccl;          ///< empty unless built with NCCL
  std::string cuda_runtime;  ///< empty unless built with CUDA
  std::string cuda_driver;   ///< "none" without a driver
  std::string hdf5;
  bool hdf5_parallel = false;
  bool gloo = false;
  std::string mpi_cuda_aware;  ///< "yes", "no", or "unknown" where the MPI library cannot be asked
};
LibraryVersions library_versions();

/// True when the MPI library reads and writes CUDA device memory itself (Open MPI's
/// MPIX_Query_cuda_support() at run time); false where it cannot say.
bool mpi_cuda_aware();

/// The GPU behind a CUDA device, as the CUDA runtime names it; nullopt for a CPU device or a
/// build without CUDA.
struct GpuDescription {
  std::string name;        ///< e.g. "NVIDIA H100 80GB HBM3"
  std::string uuid;        ///< "GPU-..." as nvidia-smi prints it
  std::string pci_bus_id;  ///< e.g. "0000:19:00.0"
  double memory_gib = 0;
  int compute_capability = 0;  ///< major * 10 + minor, e.g. 90
};
std::optional<GpuDescription> describe_gpu(const c10::Device& device);

/// Every environment variable whose name contains "NCCL", sorted by name. `envp` is a
/// null-terminated array like `environ` (injectable for tests).
std::vector<std::pair<std::string, std::string>> nccl_environment(char** envp);

/// One collective check of the sanity suite, after all ranks have compared results.
struct SanityCheckResult {
  std::string name;  ///< e.g. "allreduce(sum, float64, 1031)"
  bool ok = false;   ///< true only if every rank saw the expected values
  int ranks_ok = 0;  ///< how many ranks saw the expected values
  std::vector<int> failed_ranks;
};

/// Runs allreduce, broadcast and allgather of values every rank can compute by formula and
/// checks the results on every rank. `fault_rank` (>= 0) makes that rank contribute a wrong value,
/// so the failure path can be tested. Collective over runtime.world().
std::vector<SanityCheckResult> run_sanity_checks(const Runtime& runtime, int fault_rank = -1);

}  // namespace mpiddp
