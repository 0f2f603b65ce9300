#include <mpiddp/comm_options.hpp>
#include <mpiddp/config.hpp>
#include <mpiddp/error.hpp>
#include <mpiddp/runtime.hpp>

#include <ATen/Context.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>

#include "common/check.hpp"
#include "common/check_cuda.hpp"
#include "common/host.hpp"
#include "runtime/stall.hpp"
#include "runtime/wait.hpp"

namespace mpiddp {

namespace detail {
// Registers `comm` for CollectiveStep's stall monitoring (collective: duplicates it), and ends it.
void watch_steps(MPI_Comm comm);
void unwatch_steps(MPI_Comm comm);
}  // namespace detail

Topology topology_from_node_keys(int rank, const std::vector<long>& node_keys) {
  const int size = static_cast<int>(node_keys.size());
  MPIDDP_CHECK(rank >= 0 && rank < size,
               "rank " + std::to_string(rank) + " outside a world of " + std::to_string(size));
  Topology t;
  t.rank = rank;
  t.size = size;
  // Node index = order of the node's lowest rank; walking ranks in order meets each node first
  // at its lowest rank.
  std::map<long, int> node_index;
  for (int r = 0; r < size; ++r) {
    node_index.emplace(node_keys[static_cast<size_t>(r)], static_cast<int>(node_index.size()));
  }
  const long mine = node_keys[static_cast<size_t>(rank)];
  t.node_rank = node_index.at(mine);
  t.node_count = static_cast<int>(node_index.size());
  t.local_rank = static_cast<int>(std::count(node_keys.begin(), node_keys.begin() + rank, mine));
  t.local_size = static_cast<int>(std::count(node_keys.begin(), node_keys.end(), mine));
  return t;
}

Topology derive_topology(MPI_Comm comm, std::optional<int> node_key, MPI_Comm* node_out) {
  Topology t;
  MPIDDP_CHECK_MPI(MPI_Comm_rank(comm, &t.rank));
  MPIDDP_CHECK_MPI(MPI_Comm_size(comm, &t.size));
  MPI_Comm node = MPI_COMM_NULL;
  if (node_key) {
    MPIDDP_CHECK(*node_key >= 0, "node key must be >= 0");
    MPIDDP_CHECK_MPI(MPI_Comm_split(comm, *node_key, t.rank, &node));
  } else {
    MPIDDP_CHECK_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, t.rank, MPI_INFO_NULL, &node));
  }
  MPIDDP_CHECK_MPI(MPI_Comm_rank(node, &t.local_rank));
  MPIDDP_CHECK_MPI(MPI_Comm_size(node, &t.local_size));
  // The first rank of each node joins the leaders' communicator, ordered by world rank; its rank
  // there is the node's index, which it then tells the rest of its node.
  MPI_Comm leaders = MPI_COMM_NULL;
  MPIDDP_CHECK_MPI(MPI_Comm_split(comm, t.local_rank == 0 ? 0 : MPI_UNDEFINED, t.rank, &leaders));
  int node_info[2] = {0, 0};
  if (leaders != MPI_COMM_NULL) {
    MPIDDP_CHECK_MPI(MPI_Comm_rank(leaders, &node_info[0]));
    MPIDDP_CHECK_MPI(MPI_Comm_size(leaders, &node_info[1]));
    MPIDDP_CHECK_MPI(MPI_Comm_free(&leaders));
  }
  MPIDDP_CHECK_MPI(MPI_Bcast(node_info, 2, MPI_INT, 0, node));
  if (node_out) {
    *node_out = node;
  } else {
    MPIDDP_CHECK_MPI(MPI_Comm_free(&node));
  }
  t.node_rank = node_info[0];
  t.node_count = node_info[1];
  return t;
}

void use_deterministic_kernels() {
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  auto& context = at::globalContext();
  context.setDeterministicCuDNN(true);
  context.setBenchmarkCuDNN(false);
  context.setDeterministicAlgorithms(true, /*warn_only=*/true);
}

int fair_share_of_cores(int local_size) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, local_size));
}

c10::Device choose_device(int local_rank, int visible_gpus) {
  MPIDDP_CHECK(local_rank >= 0, "local rank must be >= 0");
  if (visible_gpus <= 0) return c10::Device(c10::kCPU);
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank % visible_gpus));
}

std::optional<LauncherSize> launcher_world_size(const std::function<const char*(const char*)>& getenv_fn) {
  auto get = [&](const char* name) -> const char* { return getenv_fn ? getenv_fn(name) : std::getenv(name); };
  // Most specific first: Open MPI's own launcher, a PMI launcher, a Slurm step, a Slurm job.
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"}) {
    const char* value = get(name);
    if (!value || !*value) continue;
    char* end = nullptr;
    long n = std::strtol(value, &end, 10);
    if (*end != '\0' || n <= 0 || n > INT_MAX) continue;  // not a count: ignore rather than guess
    return LauncherSize{name, static_cast<int>(n)};
  }
  return std::nullopt;
}

std::string thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
    default:
      return "unknown thread level " + std::to_string(level);
  }
}

namespace {

int count_visible_gpus() {
#if MPIDDP_HAS_CUDA
  int n = 0;
  // No driver or no device is not an error: the rank runs on the CPU.
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

}  // namespace

namespace {

// Open MPI's non-blocking allreduce (libnbc) picks an algorithm that reaches ~0.6-0.75x of the
// blocking MPI_Allreduce for 256 KiB-16 MiB; its ring is as fast or faster at every size measured
// (docs/performance.md#communication-vs-raw-mpi). Applied before MPI_Init, only where the user has not chosen.
void tune_mpi_defaults() {
#if defined(OPEN_MPI) && OPEN_MPI
  setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", /*overwrite=*/0);
#endif
}

}  // namespace

Runtime::Runtime(int* argc, char*** argv, const RuntimeOptions& options)
    : thread_requested_(options.requested_thread_level) {
  int initialized = 0;
  MPIDDP_CHECK_MPI(MPI_Initialized(&initialized));
  if (!initialized) tune_mpi_defaults();
  if (initialized) {
    MPIDDP_CHECK_MPI(MPI_Query_thread(&thread_provided_));
  } else {
    MPIDDP_CHECK_MPI(MPI_Init_thread(argc, argv, thread_requested_, &thread_provided_));
    owns_mpi_ = true;
  }
  // Errors come back as codes and become mpiddp::Error instead of aborting inside MPI.
  MPIDDP_CHECK_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  int world_rank = 0;
  MPIDDP_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
  set_current_rank(world_rank);  // the watchdog's line names it
  {
    BlockingCall watch("start-up (the communicators and each node's ranks, MPI)");
    MPIDDP_CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &world_));
    MPIDDP_CHECK_MPI(MPI_Comm_set_errhandler(world_, MPI_ERRORS_RETURN));
    detail::watch_steps(world_);
    topo_ = derive_topology(world_, std::nullopt, &node_);
  }
  MPIDDP_CHECK_MPI(MPI_Comm_set_errhandler(node_, MPI_ERRORS_RETURN));
  set_current_rank(topo_.rank);

  if (options.check_launcher_size && topo_.size == 1) {
    if (auto announced = launcher_world_size(); announced && announced->size > 1) {
      MPIDDP_THROW("MPI reports a world of 1 rank but " + announced->variable + "=" + std::to_string(announced->size) +
                   ": the launcher started independent singletons (srun without PMI support?); "
                   "launch with `srun --mpi=pmix` or `mpirun`");
    }
  }

  hostnames_ = allgather_strings(world_, detail::local_hostname());

  visible_gpus_ = count_visible_gpus();
  device_ = choose_device(topo_.local_rank, visible_gpus_);
#if MPIDDP_HAS_CUDA
  if (options.bind_device && device_.is_cuda()) MPIDDP_CHECK_CUDA(cudaSetDevice(device_.index()));
#endif
}

Runtime::~Runtime() {
  try {
    close();
  } catch (...) {
    // Destructors never throw; close() is there for callers who want the error.
  }
}

void Runtime::close() {
  if (closed_) return;
  closed_ = true;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (node_ != MPI_COMM_NULL) MPIDDP_CHECK_MPI(MPI_Comm_free(&node_));
  if (world_ != MPI_COMM_NULL) {
    detail::unwatch_steps(world_);
    MPIDDP_CHECK_MPI(MPI_Comm_free(&world_));
  }
  if (owns_mpi_) MPIDDP_CHECK_MPI(MPI_Finalize());
}

void Runtime::abort(int exit_code) const noexcept {
  MPI_Abort(world_ != MPI_COMM_NULL ? world_ : MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort should not return; never leave a rank behind if it does
}

namespace {

// Offsets of each rank's piece in the concatenation; checks the total fits MPI's int counts.
std::vector<int> displacements(const std::vector<int>& lens, int* total_out) {
  std::vector<int> displs(lens.size());
  long total = 0;
  for (size_t i = 0; i < lens.size(); ++i) {
    displs[i] = static_cast<int>(total);
    total += lens[i];
    MPIDDP_CHECK(total <= INT_MAX, "gathered strings exceed 2 GiB");
  }
  *total_out = static_cast<int>(total);
  return displs;
}

std::vector<std::string> split_pieces(const std::string& all, const std::vector<int>& lens,
                                      const std::vector<int>& displs) {
  std::vector<std::string> out;
  out.reserve(lens.size());
  for (size_t i = 0; i < lens.size(); ++i) {
    out.push_back(all.substr(static_cast<size_t>(displs[i]), static_cast<size_t>(lens[i])));
  }
  return out;
}

int checked_length(const std::string& s) {
  MPIDDP_CHECK(s.size() <= static_cast<size_t>(INT_MAX), "string too long to gather");
  return static_cast<int>(s.size());
}

}  // namespace

std::vector<std::string> gather_strings(MPI_Comm comm, const std::string& local, int root) {
  int rank = 0, size = 0;
  MPIDDP_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  MPIDDP_CHECK_MPI(MPI_Comm_size(comm, &size));
  int len = checked_length(local);
  std::vector<int> lens(rank == root ? static_cast<size_t>(size) : 0);
  MPI_Request rq;
  CollectiveStep step(comm, "gather of per-rank text");
  MPIDDP_CHECK_MPI(MPI_Igather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, root, comm, &rq));
  step.wait(rq);
  int total = 0;
  std::vector<int> displs = displacements(lens, &total);
  std::string all(static_cast<size_t>(total), '\0');
  MPIDDP_CHECK_MPI(
      MPI_Igatherv(local.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, root, comm, &rq));
  step.wait(rq);
  return split_pieces(all, lens, displs);
}

std::vector<std::string> allgather_strings(MPI_Comm comm, const std::string& local) {
  int size = 0;
  MPIDDP_CHECK_MPI(MPI_Comm_size(comm, &size));
  int len = checked_length(local);
  std::vector<int> lens(static_cast<size_t>(size));
  MPI_Request rq;
  CollectiveStep step(comm, "all-gather of per-rank text");
  MPIDDP_CHECK_MPI(MPI_Iallgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm, &rq));
  step.wait(rq);
  int total = 0;
  std::vector<int> displs = displacements(lens, &total);
  std::string all(static_cast<size_t>(total), '\0');
  MPIDDP_CHECK_MPI(
      MPI_Iallgatherv(local.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, comm, &rq));
  step.wait(rq);
  return split_pieces(all, lens, displs);
}

void broadcast_bytes(MPI_Comm comm, std::vector<char>& bytes, int root) {
  auto size = static_cast<int64_t>(bytes.size());
  CollectiveStep step(comm, "broadcast of bytes");
  MPI_Request rq;
  MPIDDP_CHECK_MPI(MPI_Ibcast(&size, 1, MPI_INT64_T, root, comm, &rq));
  step.wait(rq);
  bytes.resize(static_cast<size_t>(size));
  constexpr int64_t kPiece = int64_t{1} << 30;  // MPI counts are int
  for (int64_t at = 0; at < size; at += kPiece) {
    const int n = static_cast<int>(std::min(kPiece, size - at));
    MPIDDP_CHECK_MPI(MPI_Ibcast(bytes.data() + at, n, MPI_BYTE, root, comm, &rq));
    step.wait(rq);
  }
}

void broadcast_string(MPI_Comm comm, std::string& value, int root) {
  std::vector<char> bytes(value.begin(), value.end());
  broadcast_bytes(comm, bytes, root);
  value.assign(bytes.begin(), bytes.end());
}

std::vector<int64_t> allgather_int64(MPI_Comm comm, const std::vector<int64_t>& local) {
  int size = 0;
  MPIDDP_CHECK_MPI(MPI_Comm_size(comm, &size));
  MPIDDP_CHECK(local.size() <= static_cast<size_t>(INT_MAX), "too many values to gather");
  std::vector<int64_t> all(local.size() * static_cast<size_t>(size));
  const int n = static_cast<int>(local.size());
  CollectiveStep step(comm, "all-gather of per-rank values");
  MPI_Request rq;
  MPIDDP_CHECK_MPI(MPI_Iallgather(local.data(), n, MPI_INT64_T, all.data(), n, MPI_INT64_T, comm, &rq));
  step.wait(rq);
  return all;
}

int64_t broadcast_int64(MPI_Comm comm, int64_t value, int root) {
  CollectiveStep step(comm, "broadcast of a value");
  MPI_Request rq;
  MPIDDP_CHECK_MPI(MPI_Ibcast(&value, 1, MPI_INT64_T, root, comm, &rq));
  step.wait(rq);
  return value;
}

bool all_ok(MPI_Comm comm, bool local_ok) {
  int ok = local_ok ? 1 : 0;
  CollectiveStep step(comm, "agreement of all ranks");
  MPI_Request rq;
  MPIDDP_CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm, &rq));
  step.wait(rq);
  return ok == 1;
}

// ---- collective steps ----------------------------------------------------------------------

namespace {

// The communicators whose steps a stall monitor watches (a Runtime's world, from its construction
// to close()), each with its own control communicator and its steps' count.
struct WatchedComm {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm control = MPI_COMM_NULL;
  std::shared_ptr<detail::StallMonitor> monitor;  ///< null: one rank, or MPIDDP_STALL_WARNING=off
  uint64_t steps = 0;
};
// Never destroyed: a Runtime may outlive static destruction.
std::mutex& watched_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::vector<WatchedComm>& watched() {
  static auto* w = new std::vector<WatchedComm>;
  return *w;
}

}  // namespace

namespace detail {

void watch_steps(MPI_Comm comm) {
  WatchedComm w;
  w.comm = comm;
  MPIDDP_CHECK_MPI(MPI_Comm_dup(comm, &w.control));  // every rank, whatever its options say
  MPIDDP_CHECK_MPI(MPI_Comm_set_errhandler(w.control, MPI_ERRORS_RETURN));
  int rank = 0, size = 1;
  MPIDDP_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  MPIDDP_CHECK_MPI(MPI_Comm_size(comm, &size));
  const auto options = CommOptions::from_environment();
  if (size > 1 && options.stall_monitor) {
    w.monitor = std::make_shared<StallMonitor>(w.control, rank, size, options.stall_warning);
  }
  std::lock_guard<std::mutex> lock(watched_mutex());
  watched().push_back(std::move(w));
}

void unwatch_steps(MPI_Comm comm) {
  std::lock_guard<std::mutex> lock(watched_mutex());
  for (auto it = watched().begin(); it != watched().end(); ++it) {
    if (it->comm != comm) continue;
    it->monitor.reset();  // before its communicator goes
    MPI_Comm_free(&it->control);
    watched().erase(it);
    return;
  }
}

}  // namespace detail

CollectiveStep::CollectiveStep(MPI_Comm comm, std::string what) : what_(std::move(what)) {
  std::lock_guard<std::mutex> lock(watched_mutex());
  for (auto& w : watched()) {
    if (w.comm != comm) continue;
    monitor_ = w.monitor;
    seq_ = ++w.steps;
  }
}

// "<what> #<seq>", the number kept within a stall notice's 115 characters.
std::string CollectiveStep::describe() const {
  if (!seq_) return what_;
  const std::string number = " #" + std::to_string(seq_);
  constexpr size_t kRoom = 115;
  return (what_.size() + number.size() <= kRoom ? what_ : what_.substr(0, kRoom - number.size() - 3) + "...") + number;
}

void CollectiveStep::wait(MPI_Request& request) {
  static const auto timeout = CommOptions::from_environment().timeout;
  const detail::WaitSite site{seq_, [this] { return describe(); }};
  const auto done = [&request] {
    int flag = 0;
    MPIDDP_CHECK_MPI(MPI_Test(&request, &flag, MPI_STATUS_IGNORE));
    return flag != 0;
  };
  // The waiting policy is every wait's (wait.hpp); the monitor hears of long waits.
  detail::wait_until(done, std::chrono::steady_clock::now(), [&](std::chrono::steady_clock::duration waited) {
    if (monitor_) monitor_->on_wait(site, waited);
    if (waited <= timeout) return;
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(timeout).count();
    const std::string who = monitor_ ? monitor_->behind_at_timeout(site) : "a rank has stopped, hung or died";
    CollectiveTimeout error(
        describe() + " did not complete within " + std::to_string(seconds) + " s (MPIDDP_COMM_TIMEOUT): " + who,
        __FILE__, __LINE__);
    if (monitor_) error.set_reporter(monitor_->reports_timeout(site));
    throw error;  // still announced as waiting here: the rank stands where it waited
  });
  // Peers learn that this wait is over: between a step's waits this rank works (writes a part).
  if (monitor_) monitor_->on_done(site);
}

}  // namespace mpiddp
