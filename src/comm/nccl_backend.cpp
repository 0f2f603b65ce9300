// The nccl backend: CUDA tensors over an NCCL communicator that MPI bootstraps (rank 0's
// ncclUniqueId travels by MPI_Bcast; no store, no environment variables). Collectives run on the
// group's own non-blocking CUDA stream, ordered after the default stream's work by an event; a
// handle completes when its event has fired, or at once under wait_on_device(), which makes the
// default stream wait for the event instead of the host (DeviceCompletions watches it from then
// on); a timed event before it gives the collective's GPU time (device_seconds()). Raw CUDA streams
// and events keep this file free of libtorch's CUDA API, so it compiles against a CPU-only libtorch.
#include <mpiddp/error.hpp>

#include <mpiddp/runtime.hpp>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "comm/backend_factories.hpp"
#include "comm/work.hpp"
#include "common/check.hpp"
#include "common/check_cuda.hpp"

namespace mpiddp::detail {
namespace {

ncclDataType_t nccl_type(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat:
      return ncclFloat32;
    case c10::kDouble:
      return ncclFloat64;
    case c10::kBFloat16:
      return ncclBfloat16;
    case c10::kHalf:
      return ncclFloat16;
    case c10::kInt:
      return ncclInt32;
    case c10::kLong:
      return ncclInt64;
    default:
      MPIDDP_THROW("nccl backend: no NCCL type for " + dtype_name(t));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
  }
  return ncclSum;
}

// Adds the GPU time between two fired events to `*total`. A measurement, not a result: an error
// here leaves the total as it was.
void add_elapsed(cudaEvent_t started, cudaEvent_t done, std::atomic<int64_t>* total) {
  float ms = 0;
  if (cudaEventElapsedTime(&ms, started, done) == cudaSuccess) {
    total->fetch_add(static_cast<int64_t>(static_cast<double>(ms) * 1e6));
  } else {
    cudaGetLastError();
  }
}

// The collectives handed to the device by wait_on_device(): the host no longer waits for them, so
// a thread does. It polls their done events every millisecond while any is pending, adds each
// one's GPU time once it fires and frees its events; until then a BlockingCall holds the
// collective's deadline, so one that never completes (a rank stopped or died) ends the job with one
// line at the timeout, as a blocked host call does. An error NCCL or CUDA reports meanwhile ends
// the job at once, in its own words (the host may be blocked anywhere by then, unable to throw).
class DeviceCompletions {
 public:
  DeviceCompletions(int device, ncclComm_t comm, std::chrono::milliseconds timeout, std::atomic<int64_t>* device_ns)
      : device_(device), comm_(comm), timeout_(timeout), device_ns_(device_ns) {}
  ~DeviceCompletions() {
    // The group is going (its communicator next): what is pending must finish first, under its
    // watch. Then the thread stops.
    {
      std::unique_lock<std::mutex> lock(mutex_);
      for (auto& p : pending_) cudaEventSynchronize(p.done);
      reap(lock);
      stopping_ = true;
    }
    woken_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

  /// Takes the events of a collective whose completion the device now waits for.
  void add(cudaEvent_t started, cudaEvent_t done, const std::string& what) {
    auto watch = std::make_unique<BlockingCall>(what + " on the GPU", timeout_);
    std::lock_guard<std::mutex> lock(mutex_);
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    pending_.push_back({started, done, what, std::move(watch)});
    woken_.notify_one();
  }

  /// Frees what has completed (device_seconds() reads the total after this).
  void reap() {
    std::unique_lock<std::mutex> lock(mutex_);
    reap(lock);
  }

 private:
  struct Pending {
    cudaEvent_t started;
    cudaEvent_t done;
    std::string what;
    std::unique_ptr<BlockingCall> watch;
  };

  void reap(std::unique_lock<std::mutex>&) {
    // In hand-off order: the first not fired ends the pass (the collectives run in launch order on
    // one stream, so any fired behind it is reaped with it later).
    while (!pending_.empty()) {
      auto& p = pending_.front();
      const cudaError_t state = cudaEventQuery(p.done);
      if (state == cudaErrorNotReady) break;
      if (state != cudaSuccess) {
        end_job_from_watcher("CUDA error while the GPU waited for " + p.what + ": " + cudaGetErrorString(state));
      }
      add_elapsed(p.started, p.done, device_ns_);
      cudaEventDestroy(p.started);
      cudaEventDestroy(p.done);
      pending_.pop_front();
    }
    if (pending_.empty()) return;
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress) {
      end_job_from_watcher("NCCL failed during " + pending_.front().what +
                           " (waited for on the GPU): " + ncclGetErrorString(async));
    }
  }

  void run() {
    cudaSetDevice(device_);
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
      if (pending_.empty()) {
        woken_.wait(lock);
        continue;
      }
      reap(lock);
      woken_.wait_for(lock, std::chrono::milliseconds(1));
    }
  }

  int device_;
  ncclComm_t comm_;
  std::chrono::milliseconds timeout_;
  std::atomic<int64_t>* device_ns_;
  std::mutex mutex_;
  std::condition_variable woken_;
  std::deque<Pending> pending_;
  bool stopping_ = false;
  std::thread thread_;
};

class NcclWork : public PollingWork {
 public:
  /// `started` and `done` bracket the collective on the group's stream; their span is added to
  /// `*device_ns` on completion; `completions` takes them when the device waits instead of the host.
  NcclWork(const ProcessGroup::Call& call, std::chrono::milliseconds timeout, ncclComm_t comm, cudaEvent_t started,
           cudaEvent_t done, std::atomic<int64_t>* device_ns, DeviceCompletions* completions,
           std::vector<torch::Tensor> keep)
      : PollingWork(call, timeout, std::move(keep)),
        comm_(comm),
        started_event_(started),
        done_event_(done),
        device_ns_(device_ns),
        completions_(completions) {}
  ~NcclWork() override {
    settle();
    if (started_event_) cudaEventDestroy(started_event_);
    if (done_event_) cudaEventDestroy(done_event_);
  }

 protected:
  bool poll() override {
    cudaError_t q = cudaEventQuery(done_event_);
    if (q == cudaSuccess) {
      // Later work on the default stream must see the results.
      MPIDDP_CHECK_CUDA(cudaStreamWaitEvent(0, done_event_, 0));
      add_elapsed(started_event_, done_event_, device_ns_);
      return true;
    }
    MPIDDP_CHECK(q == cudaErrorNotReady,
                 std::string("CUDA error while waiting for ") + what() + ": " + cudaGetErrorString(q));
    ncclResult_t async = ncclSuccess;
    MPIDDP_CHECK_NCCL(ncclCommGetAsyncError(comm_, &async));
    MPIDDP_CHECK(async == ncclSuccess || async == ncclInProgress,
                 std::string("NCCL failed during ") + what() + ": " + ncclGetErrorString(async));
    return false;
  }

  void on_timeout() override {
    // Frees the GPU from the stuck kernel; the communicator (and so the group) is unusable after.
    ncclCommAbort(comm_);
  }

  bool hand_to_device() override {
    if (call().kind == Collective::kBarrier) return false;  // a barrier holds the host
    // Work the host queues next on the default stream starts after the collective; the buffers it
    // used may be freed now, as the caching allocator hands their memory only to that stream's later work.
    MPIDDP_CHECK_CUDA(cudaStreamWaitEvent(0, done_event_, 0));
    completions_->add(started_event_, done_event_, what());
    started_event_ = done_event_ = nullptr;  // the completions' now
    return true;
  }

 private:
  ncclComm_t comm_;
  cudaEvent_t started_event_;
  cudaEvent_t done_event_;
  std::atomic<int64_t>* device_ns_;
  DeviceCompletions* completions_;
};

class NcclProcessGroup : public ProcessGroup {
 public:
  NcclProcessGroup(const Runtime& runtime, const CommOptions& options)
      : ProcessGroup(runtime, options), device_(runtime.device()) {
    // Blocking calls of every rank (MPI's, then NCCL's): watched for a way out if one never comes.
    BlockingCall watch("NCCL set-up (the GPU check, ncclUniqueId broadcast and ncclCommInitRank)", options.timeout);
    // Every rank must have a GPU before any rank blocks in the id broadcast below.
    int without_gpu = device_.is_cuda() ? 0 : 1;
    MPIDDP_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &without_gpu, 1, MPI_INT, MPI_SUM, runtime.world()));
    MPIDDP_CHECK(without_gpu == 0, "nccl backend: " + std::to_string(without_gpu) + " of " +
                                       std::to_string(runtime.size()) + " rank(s) see no GPU; NCCL needs one per rank");
    // Two ranks on one GPU cannot share an NCCL communicator ("Duplicate GPU detected").
    MPIDDP_CHECK(runtime.local_size() <= runtime.visible_gpus(),
                 "nccl backend: " + std::to_string(runtime.local_size()) + " ranks on node " +
                     std::to_string(runtime.node_rank()) + " but only " + std::to_string(runtime.visible_gpus()) +
                     " GPU(s); NCCL needs one GPU per rank");
    MPIDDP_CHECK_CUDA(cudaSetDevice(device_.index()));
    ncclUniqueId id;
    if (runtime.rank() == 0) MPIDDP_CHECK_NCCL(ncclGetUniqueId(&id));
    MPIDDP_CHECK_MPI(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, runtime.world()));
    MPIDDP_CHECK_NCCL(ncclCommInitRank(&comm_, runtime.size(), id, runtime.rank()));
    MPIDDP_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    MPIDDP_CHECK_CUDA(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    MPIDDP_CHECK_CUDA(cudaMalloc(&barrier_buf_, sizeof(float)));
    completions_ = std::make_unique<DeviceCompletions>(device_.index(), comm_, options.timeout, &device_ns_);
  }

  ~NcclProcessGroup() override {
    completions_.reset();  // before the communicator: what it still runs completes first
    if (barrier_buf_) cudaFree(barrier_buf_);
    if (ready_) cudaEventDestroy(ready_);
    if (stream_) cudaStreamDestroy(stream_);
    if (comm_) ncclCommDestroy(comm_);
  }

  std::string backend() const override { return "nccl"; }
  std::optional<double> device_seconds() const override {
    completions_->reap();
    return static_cast<double>(device_ns_.load()) * 1e-9;
  }
  bool averages_natively() const override { return true; }  // ncclAvg

 protected:
  void check_device(const c10::Device& device, const std::string& what) const override {
    MPIDDP_CHECK(device == device_, what + ": the nccl backend on this rank takes tensors on " + device_.str() +
                                        ", got one on " + device.str());
  }

  WorkHandle launch(const Call& c) override {
    MPIDDP_CHECK_CUDA(cudaSetDevice(device_.index()));
    // The group's stream starts after everything already queued on the default stream.
    MPIDDP_CHECK_CUDA(cudaEventRecord(ready_, 0));
    MPIDDP_CHECK_CUDA(cudaStreamWaitEvent(stream_, ready_, 0));
    cudaEvent_t started = nullptr;
    MPIDDP_CHECK_CUDA(cudaEventCreate(&started));  // timed: device_seconds()
    MPIDDP_CHECK_CUDA(cudaEventRecord(started, stream_));
    std::vector<torch::Tensor> keep = {c.input, c.output};
    if (c.kind == Collective::kBarrier) {
      MPIDDP_CHECK_NCCL(ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat32, ncclSum, comm_, stream_));
    } else {
      const auto type = nccl_type(c.input.scalar_type());
      const int n = size();
      void* in = c.input.data_ptr();
      void* out = c.output.data_ptr();
      switch (c.kind) {
        case Collective::kAllreduce:
          MPIDDP_CHECK_NCCL(
              ncclAllReduce(in, out, static_cast<size_t>(c.input.numel()), type, nccl_op(c.op), comm_, stream_));
          break;
        case Collective::kBroadcast:
          MPIDDP_CHECK_NCCL(
              ncclBroadcast(in, out, static_cast<size_t>(c.output.numel()), type, c.root, comm_, stream_));
          break;
        case Collective::kAllgather:  // in place: input is this rank's slice of the output, as NCCL allows
          MPIDDP_CHECK_NCCL(ncclAllGather(in, out, static_cast<size_t>(c.input.numel()), type, comm_, stream_));
          break;
        case Collective::kReduceScatter:  // in place: output is this rank's slice of the input
          MPIDDP_CHECK_NCCL(
              ncclReduceScatter(in, out, static_cast<size_t>(c.output.numel()), type, nccl_op(c.op), comm_, stream_));
          break;
        case Collective::kAlltoall: {
          // NCCL has no alltoall: grouped point-to-point, as PyTorch's ProcessGroupNCCL does.
          torch::Tensor source = c.in_place ? c.input.clone() : c.input;
          keep.push_back(source);
          const size_t chunk = static_cast<size_t>(c.input.numel() / n);
          const size_t bytes = chunk * static_cast<size_t>(c.input.element_size());
          auto* src = static_cast<char*>(source.data_ptr());
          auto* dst = static_cast<char*>(out);
          MPIDDP_CHECK_NCCL(ncclGroupStart());
          for (int r = 0; r < n; ++r) {
            MPIDDP_CHECK_NCCL(ncclSend(src + r * bytes, chunk, type, r, comm_, stream_));
            MPIDDP_CHECK_NCCL(ncclRecv(dst + r * bytes, chunk, type, r, comm_, stream_));
          }
          MPIDDP_CHECK_NCCL(ncclGroupEnd());
          break;
        }
        case Collective::kBarrier:
          break;
      }
    }
    cudaEvent_t done = nullptr;
    MPIDDP_CHECK_CUDA(cudaEventCreate(&done));
    MPIDDP_CHECK_CUDA(cudaEventRecord(done, stream_));
    return std::make_unique<NcclWork>(c, options().timeout, comm_, started, done, &device_ns_, completions_.get(),
                                      std::move(keep));
  }

 private:
  c10::Device device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  void* barrier_buf_ = nullptr;
  std::atomic<int64_t> device_ns_{0};  ///< GPU time of the completed collectives
  std::unique_ptr<DeviceCompletions> completions_;
};

}  // namespace

std::unique_ptr<ProcessGroup> make_nccl_group(const Runtime& runtime, const CommOptions& options) {
  return std::make_unique<NcclProcessGroup>(runtime, options);
}

}  // namespace mpiddp::detail
