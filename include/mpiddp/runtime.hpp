// Runtime: MPI bootstrap. MPI alone says who each process is; everything else (node-local rank,
// node index, hostnames, the device) is derived from it. No launcher variables are read except
// to detect a launcher that started singletons.
#pragma once

#include <mpi.h>

#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mpiddp {

namespace detail {
class StallMonitor;
}

/// Where one rank sits. Field names follow torchrun's variables in the comments.
struct Topology {
  int rank = 0;        ///< RANK
  int size = 1;        ///< WORLD_SIZE
  int local_rank = 0;  ///< LOCAL_RANK: index among the ranks of the same node
  int local_size = 1;  ///< LOCAL_WORLD_SIZE: ranks on this node
  int node_rank = 0;   ///< GROUP_RANK: index of this node
  int node_count = 1;  ///< number of nodes

  bool operator==(const Topology& o) const {
    return rank == o.rank && size == o.size && local_rank == o.local_rank && local_size == o.local_size &&
           node_rank == o.node_rank && node_count == o.node_count;
  }
};

/// The rule, as a pure function: `node_keys[r]` identifies rank r's node. Nodes are numbered in the
/// order of their lowest world rank; ranks within a node in world-rank order. Throws on a bad rank.
Topology topology_from_node_keys(int rank, const std::vector<long>& node_keys);

/// Derives the topology over `comm` with MPI. Ranks are grouped by MPI_COMM_TYPE_SHARED, or by
/// `node_key` when given (tests use it to emulate several nodes on one machine). Collective.
/// When `node_out` is given it receives the node's communicator (the caller frees it).
Topology derive_topology(MPI_Comm comm, std::optional<int> node_key = std::nullopt, MPI_Comm* node_out = nullptr);

/// The device a rank uses: cuda:(local_rank % visible_gpus) when GPUs are visible, else cpu.
c10::Device choose_device(int local_rank, int visible_gpus);

/// Threads per rank that never oversubscribe: this node's cores shared among its `local_size` ranks
/// (at least 1). `mpiddp train`'s default --threads and `mpiddp launch`'s OMP_NUM_THREADS.
int fair_share_of_cores(int local_size);

/// Deterministic kernels for this process, so that a CUDA run repeats bitwise and a resumed run ends
/// where the whole run ends: cuDNN's deterministic algorithms without benchmarking, PyTorch's
/// deterministic mode (an op that has no deterministic kernel warns once instead of failing) and
/// cuBLAS's fixed workspace (CUBLAS_WORKSPACE_CONFIG=:4096:8 unless already set). CPU kernels are
/// deterministic already. Call before the first CUDA matrix product.
void use_deterministic_kernels();

/// The world size a launcher announced in the environment (OMPI_COMM_WORLD_SIZE, PMI_SIZE,
/// SLURM_STEP_NUM_TASKS, SLURM_NTASKS, first found) with the variable's name, or nullopt.
/// `getenv` is injectable for tests.
struct LauncherSize {
  std::string variable;
  int size = 0;
};
std::optional<LauncherSize> launcher_world_size(const std::function<const char*(const char*)>& getenv_fn = nullptr);

/// "MPI_THREAD_MULTIPLE" etc.
std::string thread_level_name(int level);

/// Options for Runtime.
struct RuntimeOptions {
  /// Thread level to request from MPI_Init_thread.
  int requested_thread_level = MPI_THREAD_MULTIPLE;
  /// Fail when a launcher announced N > 1 ranks but MPI sees a world of 1 (srun without PMI).
  bool check_launcher_size = true;
  /// Bind this rank to its GPU (cudaSetDevice) when one is chosen; required before NCCL init.
  bool bind_device = true;
};

/// Owns MPI for the process: initialises it (unless the program already did), duplicates
/// MPI_COMM_WORLD so mpiddp's traffic never matches user messages, sets MPI_ERRORS_RETURN so
/// failures become mpiddp::Error, and derives the topology, hostnames and device. Finalises MPI
/// in close() or the destructor only if it initialised it. One per process.
class Runtime {
 public:
  Runtime(int* argc, char*** argv, const RuntimeOptions& options = {});
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const Topology& topology() const { return topo_; }
  int rank() const { return topo_.rank; }
  int size() const { return topo_.size; }
  int local_rank() const { return topo_.local_rank; }
  int local_size() const { return topo_.local_size; }
  int node_rank() const { return topo_.node_rank; }
  int node_count() const { return topo_.node_count; }

  /// Every rank's hostname, indexed by world rank.
  const std::vector<std::string>& hostnames() const { return hostnames_; }
  const std::string& hostname() const { return hostnames_[static_cast<size_t>(topo_.rank)]; }

  /// The device this rank uses (see choose_device) and the GPUs visible to it.
  c10::Device device() const { return device_; }
  int visible_gpus() const { return visible_gpus_; }

  int thread_level_requested() const { return thread_requested_; }
  int thread_level_provided() const { return thread_provided_; }

  /// mpiddp's duplicate of MPI_COMM_WORLD, and the communicator of this node's ranks.
  MPI_Comm world() const { return world_; }
  MPI_Comm node() const { return node_; }

  /// Ends every rank of the job at once; for errors after which ranks cannot agree.
  [[noreturn]] void abort(int exit_code) const noexcept;

  /// Frees the communicators and finalises MPI if this Runtime initialised it. Idempotent.
  void close();

 private:
  Topology topo_;
  std::vector<std::string> hostnames_;
  c10::Device device_{c10::kCPU};
  int visible_gpus_ = 0;
  int thread_requested_ = 0;
  int thread_provided_ = 0;
  MPI_Comm world_ = MPI_COMM_NULL;
  MPI_Comm node_ = MPI_COMM_NULL;
  bool owns_mpi_ = false;
  bool closed_ = false;
};

/// Gathers one string per rank to `root` in rank order (empty vector on other ranks). Collective.
std::vector<std::string> gather_strings(MPI_Comm comm, const std::string& local, int root = 0);
/// Every rank gets every rank's string, in rank order. Collective.
std::vector<std::string> allgather_strings(MPI_Comm comm, const std::string& local);

/// `root`'s string replaces `value` on every rank. Collective.
void broadcast_string(MPI_Comm comm, std::string& value, int root = 0);
/// `root`'s bytes replace `bytes` on every rank (any size: sent in pieces). Collective.
void broadcast_bytes(MPI_Comm comm, std::vector<char>& bytes, int root = 0);

/// `root`'s value, on every rank. Collective.
int64_t broadcast_int64(MPI_Comm comm, int64_t value, int root = 0);

/// All ranks agree on a verdict: true only if `local_ok` is true on every rank. Collective.
bool all_ok(MPI_Comm comm, bool local_ok);

/// Every rank's `local` values (the same count on every rank), in rank order. Collective.
std::vector<int64_t> allgather_int64(MPI_Comm comm, const std::vector<int64_t>& local);

/// One collective step of every rank of `comm`, made of non-blocking MPI operations (a collective,
/// or the messages of a transfer through one rank); every rank makes the same steps in the same
/// order. Each wait ends at the communication timeout (MPIDDP_COMM_TIMEOUT) with
/// CollectiveTimeout. On a Runtime's world() a wait that grows long also logs, every
/// MPIDDP_STALL_WARNING, which ranks are behind and where, and the timeout error names them, as
/// for a process group's collectives. The helpers above are such steps. Main thread only (steps
/// are numbered in the order they are made).
class CollectiveStep {
 public:
  CollectiveStep(MPI_Comm comm, std::string what);
  CollectiveStep(const CollectiveStep&) = delete;
  CollectiveStep& operator=(const CollectiveStep&) = delete;

  /// Waits for `request`, one of this step's operations.
  void wait(MPI_Request& request);

 private:
  std::string describe() const;  ///< "agreement of all ranks #12"

  std::string what_;
  std::shared_ptr<detail::StallMonitor> monitor_;  ///< null: `comm` is not watched
  uint64_t seq_ = 0;
};

/// A blocking call that waits for other ranks and cannot be waited on in steps: HDF5's collective
/// MPI-IO (a parallel snapshot, a dataset read collectively), MPI's and NCCL's set-up calls. For as
/// long as the object lives a watchdog thread holds the call's deadline: the communication timeout
/// (MPIDDP_COMM_TIMEOUT), plus half a second a rank up to 5 s so that the lowest waiting rank
/// speaks first. Past it the blocked thread cannot be woken to throw, so the watchdog writes the
/// error line ("<what> did not complete within N s ...") and ends the job (MPI_Abort where MPI lets
/// another thread call it, else this process exits with 1).
class BlockingCall {
 public:
  explicit BlockingCall(std::string what);  ///< the timeout from the environment
  BlockingCall(std::string what, std::chrono::milliseconds timeout);
  ~BlockingCall();
  BlockingCall(const BlockingCall&) = delete;
  BlockingCall& operator=(const BlockingCall&) = delete;

 private:
  uint64_t id_;
};

/// Ends the job from a thread other than the one blocked: writes "mpiddp: error: [rank R] <what>"
/// as one line, then MPI_Abort where MPI lets any thread call it, else this process exits with 1.
/// BlockingCall's watchdog ends a job so; so does a watcher that learns of a failure the blocked
/// thread cannot (NCCL's asynchronous errors on a collective the device waits for).
[[noreturn]] void end_job_from_watcher(const std::string& what);

}  // namespace mpiddp
