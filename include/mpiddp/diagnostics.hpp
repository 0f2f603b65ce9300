// What `mpiddp info` reports: library versions, NCCL variables, and a collective sanity check.
#pragma once

#include <mpiddp/runtime.hpp>

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
  std::string nccl;          ///< empty unless built with NCCL
  std::string cuda_runtime;  ///< empty unless built with CUDA
  std::string cuda_driver;   ///< "none" without a driver
  std::string hdf5;
  bool hdf5_parallel = false;
  bool gloo = false;
};
LibraryVersions library_versions();

/// Every environment variable whose name contains "NCCL", sorted by name. `envp` is a
/// null-terminated array like `environ` (injectable for tests).
std::vector<std::pair<std::string, std::string>> nccl_environment(char** envp);

/// One collective check of the sanity suite, after all ranks have compared results.
struct SanityCheckResult {
  std::string name;      ///< e.g. "allreduce(sum, float64, 1031)"
  bool ok = false;       ///< true only if every rank saw the expected values
  int ranks_ok = 0;      ///< how many ranks saw the expected values
  std::vector<int> failed_ranks;
};

/// Runs allreduce, broadcast and allgather of values every rank can compute by formula and
/// checks the results on every rank. `fault_rank` (>= 0) makes that rank contribute a wrong value,
/// so the failure path can be tested. Collective over runtime.world().
std::vector<SanityCheckResult> run_sanity_checks(const Runtime& runtime, int fault_rank = -1);

}  // namespace mpiddp
