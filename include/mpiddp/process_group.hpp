// The communication layer: one ProcessGroup interface over torch::Tensor with several backends
// (mpi always; nccl and gloo when built). The DDP engine and every tool talk through it.
//
// Cross-rank contract: every rank issues the same collectives in the same order with the same
// dtypes, element counts and roots. Each collective gets a sequence number (1, 2, ...) per group.
// In check mode every rank exchanges a descriptor of each collective with every other rank
// before launching it, so a mismatch is reported on every rank (naming the ranks and what each
// issued) instead of hanging, and a timeout can name the ranks that have not arrived.
#pragma once

#include <mpiddp/collective.hpp>
#include <mpiddp/comm_options.hpp>
#include <mpiddp/error.hpp>
#include <mpiddp/runtime.hpp>

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mpiddp {
namespace detail {
class StallMonitor;
}

std::string to_string(ReduceOp op);
std::string to_string(Collective c);
/// "sum" -> kSum etc.; throws mpiddp::Error naming the accepted values.
ReduceOp parse_reduce_op(const std::string& name);
Collective parse_collective(const std::string& name);
/// "float32", "bfloat16", ... (the names `--dtype` accepts); throws on others.
c10::ScalarType parse_dtype(const std::string& name);
std::string dtype_name(c10::ScalarType t);
/// The dtypes collectives accept: float32, float64, bfloat16, float16, int32, int64.
bool is_supported_dtype(c10::ScalarType t);

/// Handle to an asynchronous collective. Outputs are valid once test() returned true or wait()
/// returned. Dropping an incomplete handle waits for it (a collective cannot be cancelled).
class Work {
 public:
  virtual ~Work() = default;
  /// Drives progress without blocking; true once complete. Throws if the collective failed.
  virtual bool test() = 0;
  /// Blocks until complete; throws CollectiveTimeout after the group's timeout.
  virtual void wait() = 0;
  /// Orders what the host queues next on the device after the collective, blocking the host only
  /// where the backend cannot do that: the nccl backend makes the default CUDA stream (the legacy
  /// stream 0, libtorch's unless a stream guard chose another; the nccl group orders its collectives
  /// after that stream too) wait for the collective's event and returns at once (PyTorch's
  /// ProcessGroupNCCL wait()); a thread then watches it, which ends the job with one line past the
  /// timeout (BlockingCall's rule) or on an NCCL error, and test() says true. A barrier, and every
  /// other backend, waits as wait() does. For results that only the device reads next (DDP's
  /// buckets, ZeRO's gathered parameters).
  virtual void wait_on_device() { wait(); }
  bool is_completed() { return test(); }
};
using WorkHandle = std::unique_ptr<Work>;

/// One communicator of all ranks of a Runtime over one backend. Tensors must be contiguous, of a
/// supported dtype, and on a device the backend takes (mpi: cpu or cuda; gloo: cpu; nccl: cuda).
/// Passing the same tensor as input and output runs in place; for allgather, in place means the
/// input is this rank's slice of the output, for reduce_scatter the output is this rank's slice
/// of the input (nccl-tests' convention).
class ProcessGroup {
 public:
  virtual ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  virtual std::string backend() const = 0;
  /// Whether this backend can run `c` on `dtype` with `op` (nccl-tests' "supported" matrix).
  virtual bool supports(Collective c, c10::ScalarType dtype, ReduceOp op) const;
  int rank() const { return rank_; }
  int size() const { return size_; }
  const CommOptions& options() const { return options_; }
  /// Sequence number of the last collective issued (0 before the first).
  uint64_t sequence() const { return seq_; }
  /// Memory the backend holds beside input and output while a reduce-scatter of `input_bytes` is in
  /// flight (the memory plan's).
  virtual int64_t reduce_scatter_scratch_bytes(int64_t /*input_bytes*/) const { return 0; }
  /// GPU time of this group's completed collectives, in seconds, from CUDA events recorded around
  /// each on the group's stream (nccl); nullopt where the backend does not measure it.
  virtual std::optional<double> device_seconds() const { return std::nullopt; }

  /// output = op over ranks of input (same shape).
  WorkHandle allreduce_async(const torch::Tensor& input, const torch::Tensor& output, ReduceOp op);
  /// output = root's input on every rank (input is read on root only; may be output).
  WorkHandle broadcast_async(const torch::Tensor& input, const torch::Tensor& output, int root);
  /// output (size * input.numel() elements) = every rank's input, in rank order.
  WorkHandle allgather_async(const torch::Tensor& input, const torch::Tensor& output);
  /// input has size * output.numel() elements; output = op over ranks of this rank's slice.
  WorkHandle reduce_scatter_async(const torch::Tensor& input, const torch::Tensor& output, ReduceOp op);
  /// input and output hold size equal slices; output slice r = rank r's input slice for this rank.
  WorkHandle alltoall_async(const torch::Tensor& input, const torch::Tensor& output);
  WorkHandle barrier_async();

  /// Blocking forms.
  void allreduce(const torch::Tensor& tensor, ReduceOp op = ReduceOp::kSum) {
    allreduce_async(tensor, tensor, op)->wait();
  }
  void broadcast(const torch::Tensor& tensor, int root) { broadcast_async(tensor, tensor, root)->wait(); }
  void allgather(const torch::Tensor& input, const torch::Tensor& output) { allgather_async(input, output)->wait(); }
  void reduce_scatter(const torch::Tensor& input, const torch::Tensor& output, ReduceOp op = ReduceOp::kSum) {
    reduce_scatter_async(input, output, op)->wait();
  }
  void alltoall(const torch::Tensor& input, const torch::Tensor& output) { alltoall_async(input, output)->wait(); }
  void barrier() { barrier_async()->wait(); }

  /// A validated collective as the backends receive it.
  struct Call {
    Collective kind = Collective::kBarrier;
    torch::Tensor input, output;
    ReduceOp op = ReduceOp::kSum;
    int root = 0;
    uint64_t seq = 0;
    bool in_place = false;
    std::shared_ptr<detail::StallMonitor> stall;  ///< names stalled ranks (set by the group)
    std::string describe() const;                 ///< "allreduce #7 (float32[1031], sum)"
  };

 protected:
  ProcessGroup(const Runtime& runtime, CommOptions options);
  /// Starts `call` (arguments already validated) and returns its handle. Unless
  /// averages_natively(), an avg reduction is to be run as a sum: the group divides afterwards.
  virtual WorkHandle launch(const Call& call) = 0;
  /// True when the backend computes ReduceOp::kAvg itself (NCCL's ncclAvg).
  virtual bool averages_natively() const { return false; }
  /// Throws mpiddp::Error unless this backend can use tensors on `device` ("<what>: ..." prefix).
  virtual void check_device(const c10::Device& device, const std::string& what) const = 0;

 private:
  WorkHandle issue(Call call);
  /// launch(), plus the division by the world size for averages the backend runs as sums.
  WorkHandle start(const Call& call);
  void validate(const Call& call) const;

  const Runtime& runtime_;
  CommOptions options_;
  int rank_ = 0;
  int size_ = 1;
  uint64_t seq_ = 0;
  MPI_Comm control_ = MPI_COMM_NULL;  ///< check mode's descriptor exchange and stall notices
  std::shared_ptr<detail::StallMonitor> stall_;

 public:
  struct Checker;  ///< check mode's state (opaque; defined in process_group.cpp)

 private:
  std::shared_ptr<Checker> checker_;
};

/// Backend names built into this binary, "mpi" first.
std::vector<std::string> available_backends();
/// Creates the group; throws mpiddp::Error for a backend that is not built or cannot start.
/// Collective over runtime.world().
std::unique_ptr<ProcessGroup> make_process_group(const std::string& backend, const Runtime& runtime,
                                                 const CommOptions& options = CommOptions::from_environment());

}  // namespace mpiddp
