#include <mpiddp/compat.hpp>
#include <mpiddp/config.hpp>
#include <mpiddp/diagnostics.hpp>
#include <mpiddp/error.hpp>

#include <ATen/detail/CUDAHooksInterface.h>
#include <hdf5.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "common/check.hpp"
#include "common/check_cuda.hpp"

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

namespace mpiddp {
namespace {

std::string cuda_version_text(long v) {  // 13000 -> "13.0"
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

// libtorch's CUDA kernels register CUDA hooks when libtorch_cuda is loaded; a CPU-only libtorch (or
// an executable that dropped libtorch_cuda at link time) keeps the default hooks, which refuse.
std::string torch_cuda_version() {
  try {
    return cuda_version_text(at::detail::getCUDAHooks().versionCUDART());
  } catch (const c10::Error&) {
    return "";
  }
}

}  // namespace

LibraryVersions library_versions() {
  LibraryVersions v;
  v.mpiddp = MPIDDP_VERSION;

  char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPIDDP_CHECK_MPI(MPI_Get_library_version(lib, &len));
  v.mpi = std::string(lib, static_cast<size_t>(len));
  v.mpi = v.mpi.substr(0, v.mpi.find_first_of(std::string("\r\n\0", 3)));
  while (!v.mpi.empty() && (v.mpi.back() == ' ' || v.mpi.back() == ',' || v.mpi.back() == '\0')) v.mpi.pop_back();
  int major = 0, minor = 0;
  MPIDDP_CHECK_MPI(MPI_Get_version(&major, &minor));
  v.mpi_standard = std::to_string(major) + "." + std::to_string(minor);

  v.torch = compat::torch_version();
  v.torch_cuda = torch_cuda_version();

#if MPIDDP_HAS_NCCL
  int nccl = 0;
  MPIDDP_CHECK_NCCL(ncclGetVersion(&nccl));
  v.nccl = std::to_string(nccl / 10000) + "." + std::to_string((nccl % 10000) / 100) + "." +
           std::to_string(nccl % 100) + " (built with " + std::to_string(NCCL_MAJOR) + "." +
           std::to_string(NCCL_MINOR) + "." + std::to_string(NCCL_PATCH) + ")";
#endif
#if MPIDDP_HAS_CUDA
  int runtime = 0, driver = 0;
  if (cudaRuntimeGetVersion(&runtime) == cudaSuccess) v.cuda_runtime = cuda_version_text(runtime);
  if (cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0) {
    v.cuda_driver = cuda_version_text(driver);
  } else {
    v.cuda_driver = "none";
  }
  (void)cudaGetLastError();
#endif

  unsigned h5_major = 0, h5_minor = 0, h5_release = 0;
  H5get_libversion(&h5_major, &h5_minor, &h5_release);
  v.hdf5 = std::to_string(h5_major) + "." + std::to_string(h5_minor) + "." + std::to_string(h5_release);
  v.hdf5_parallel = MPIDDP_HDF5_PARALLEL == 1;
  v.gloo = MPIDDP_HAS_GLOO == 1;
#if defined(MPIX_CUDA_AWARE_SUPPORT)
  v.mpi_cuda_aware = mpi_cuda_aware() ? "yes" : "no";
#else
  v.mpi_cuda_aware = "unknown";
#endif
  return v;
}

bool mpi_cuda_aware() {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

std::optional<GpuDescription> describe_gpu(const c10::Device& device) {
#if MPIDDP_HAS_CUDA
  if (!device.is_cuda()) return std::nullopt;
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, device.index()) != cudaSuccess) {
    (void)cudaGetLastError();
    return std::nullopt;
  }
  GpuDescription g;
  g.name = p.name;
  char uuid[64];
  const auto* u = reinterpret_cast<const unsigned char*>(p.uuid.bytes);
  std::snprintf(uuid, sizeof uuid, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
                u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
  g.uuid = uuid;
  char bus[32] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, device.index()) == cudaSuccess) g.pci_bus_id = bus;
  g.memory_gib = static_cast<double>(p.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0);
  g.compute_capability = p.major * 10 + p.minor;
  (void)cudaGetLastError();
  return g;
#else
  (void)device;
  return std::nullopt;
#endif
}

std::vector<std::pair<std::string, std::string>> nccl_environment(char** envp) {
  std::vector<std::pair<std::string, std::string>> out;
  for (char** e = envp; e && *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (!eq) continue;
    std::string name(*e, static_cast<size_t>(eq - *e));
    if (name.find("NCCL") != std::string::npos) out.emplace_back(name, eq + 1);
  }
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

constexpr int kFloatCount = 1031;  // odd and prime: no power-of-two chunking hides a tail bug
constexpr int kIntCount = 17;
constexpr int kGatherCount = 5;

// Each check returns whether this rank saw what the formula predicts.
bool check_allreduce_sum(MPI_Comm comm, int rank, int size, bool fault) {
  std::vector<double> x(kFloatCount);
  for (size_t i = 0; i < x.size(); ++i) x[i] = rank + 0.5 * static_cast<double>(i);
  if (fault) x[7] += 1.0;
  MPIDDP_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, x.data(), kFloatCount, MPI_DOUBLE, MPI_SUM, comm));
  // sum over r of (r + i/2) = size*(size-1)/2 + size*i/2: exact in binary64 at these sizes
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] != size * (size - 1) / 2.0 + size * 0.5 * static_cast<double>(i)) return false;
  }
  return true;
}

bool check_allreduce_max(MPI_Comm comm, int rank, int size, bool fault) {
  std::vector<int64_t> x(kIntCount);
  for (size_t i = 0; i < x.size(); ++i) x[i] = int64_t{rank} * 1000 + static_cast<int64_t>(i);
  if (fault) x[3] = int64_t{1} << 40;
  MPIDDP_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, x.data(), kIntCount, MPI_INT64_T, MPI_MAX, comm));
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] != int64_t{size - 1} * 1000 + static_cast<int64_t>(i)) return false;
  }
  return true;
}

bool check_broadcast(MPI_Comm comm, int rank, int size, bool fault) {
  const int root = size - 1;  // not rank 0: a root-0 assumption would go unnoticed otherwise
  std::vector<float> x(kFloatCount, -1.0f);
  if (rank == root) {
    for (size_t i = 0; i < x.size(); ++i) x[i] = 3.0f * static_cast<float>(i) + 7.0f;
  }
  if (fault && rank == root) x[11] = 0.0f;
  MPIDDP_CHECK_MPI(MPI_Bcast(x.data(), kFloatCount, MPI_FLOAT, root, comm));
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] != 3.0f * static_cast<float>(i) + 7.0f) return false;
  }
  return true;
}

bool check_allgather(MPI_Comm comm, int rank, int size, bool fault) {
  std::vector<int32_t> mine(kGatherCount);
  for (int j = 0; j < kGatherCount; ++j) mine[static_cast<size_t>(j)] = rank * 10 + j;
  if (fault) mine[0] = -1;
  std::vector<int32_t> all(static_cast<size_t>(kGatherCount) * static_cast<size_t>(size));
  MPIDDP_CHECK_MPI(MPI_Allgather(mine.data(), kGatherCount, MPI_INT32_T, all.data(), kGatherCount, MPI_INT32_T, comm));
  for (int r = 0; r < size; ++r) {
    for (int j = 0; j < kGatherCount; ++j) {
      if (all[static_cast<size_t>(r * kGatherCount + j)] != r * 10 + j) return false;
    }
  }
  return true;
}

}  // namespace

std::vector<SanityCheckResult> run_sanity_checks(const Runtime& runtime, int fault_rank) {
  struct Check {
    std::string name;
    bool (*run)(MPI_Comm, int, int, bool);
  };
  const std::vector<Check> checks = {
      {"allreduce(sum, float64, " + std::to_string(kFloatCount) + ")", check_allreduce_sum},
      {"allreduce(max, int64, " + std::to_string(kIntCount) + ")", check_allreduce_max},
      {"broadcast(float32, " + std::to_string(kFloatCount) + ", root " + std::to_string(runtime.size() - 1) + ")",
       check_broadcast},
      {"allgather(int32, " + std::to_string(kGatherCount) + " per rank)", check_allgather},
  };
  MPI_Comm comm = runtime.world();
  const bool fault = runtime.rank() == fault_rank;
  std::vector<SanityCheckResult> results;
  for (const auto& check : checks) {
    // Plain blocking MPI (the checks are of MPI itself), watched for a way out.
    BlockingCall watch("sanity check " + check.name + " (MPI)");
    int ok = check.run(comm, runtime.rank(), runtime.size(), fault) ? 1 : 0;
    std::vector<int> oks(static_cast<size_t>(runtime.size()));
    MPIDDP_CHECK_MPI(MPI_Allgather(&ok, 1, MPI_INT, oks.data(), 1, MPI_INT, comm));
    SanityCheckResult r;
    r.name = check.name;
    for (int i = 0; i < runtime.size(); ++i) {
      if (oks[static_cast<size_t>(i)]) {
        ++r.ranks_ok;
      } else {
        r.failed_ranks.push_back(i);
      }
    }
    r.ok = r.failed_ranks.empty();
    results.push_back(std::move(r));
  }
  return results;
}

}  // namespace mpiddp
