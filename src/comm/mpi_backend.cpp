// The mpi backend: non-blocking MPI collectives on CPU tensors and on CUDA tensors (handed to a
// CUDA-aware MPI library directly where it can, else staged through host memory). MPI has no
// bfloat16/float16 types: they travel as 2-byte opaque elements and are reduced by user-defined
// ops that compute in float32 and round once per pairwise combination, as NCCL does.
#include <mpiddp/diagnostics.hpp>
#include <mpiddp/error.hpp>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <climits>

#include "comm/backend_factories.hpp"
#include "comm/work.hpp"
#include "common/check.hpp"
#include "common/check_cuda.hpp"

namespace mpiddp::detail {
namespace {

template <typename T, typename F>
void combine(void* in, void* inout, int* len, F f) {
  auto* a = static_cast<const T*>(in);
  auto* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = T(f(static_cast<float>(a[i]), static_cast<float>(b[i])));
}

template <typename T>
void sum_fn(void* in, void* inout, int* len, MPI_Datatype*) {
  combine<T>(in, inout, len, [](float x, float y) { return x + y; });
}
template <typename T>
void min_fn(void* in, void* inout, int* len, MPI_Datatype*) {
  combine<T>(in, inout, len, [](float x, float y) { return x < y ? x : y; });
}
template <typename T>
void max_fn(void* in, void* inout, int* len, MPI_Datatype*) {
  combine<T>(in, inout, len, [](float x, float y) { return x > y ? x : y; });
}

class MpiWork : public PollingWork {
 public:
  MpiWork(const ProcessGroup::Call& call, std::chrono::milliseconds timeout, MPI_Request request,
          std::vector<torch::Tensor> keep, std::function<void()> finish)
      : PollingWork(call, timeout, std::move(keep), std::move(finish)), request_(request) {}
  ~MpiWork() override { settle(); }

 protected:
  bool poll() override {
    int flag = 0;
    MPIDDP_CHECK_MPI(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE));
    return flag != 0;
  }

 private:
  MPI_Request request_;
};

class MpiProcessGroup : public ProcessGroup {
 public:
  MpiProcessGroup(const Runtime& runtime, const CommOptions& options)
      : ProcessGroup(runtime, options), cuda_aware_(mpi_cuda_aware()) {
    {
      BlockingCall watch("mpi backend set-up (its communicator, MPI_Comm_dup)", options.timeout);
      MPIDDP_CHECK_MPI(MPI_Comm_dup(runtime.world(), &comm_));
    }
    MPIDDP_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    MPIDDP_CHECK_MPI(MPI_Type_contiguous(2, MPI_BYTE, &half_type_));
    MPIDDP_CHECK_MPI(MPI_Type_commit(&half_type_));
    MPIDDP_CHECK_MPI(MPI_Op_create(&sum_fn<c10::BFloat16>, 1, &bf16_ops_[0]));
    MPIDDP_CHECK_MPI(MPI_Op_create(&min_fn<c10::BFloat16>, 1, &bf16_ops_[1]));
    MPIDDP_CHECK_MPI(MPI_Op_create(&max_fn<c10::BFloat16>, 1, &bf16_ops_[2]));
    MPIDDP_CHECK_MPI(MPI_Op_create(&sum_fn<c10::Half>, 1, &fp16_ops_[0]));
    MPIDDP_CHECK_MPI(MPI_Op_create(&min_fn<c10::Half>, 1, &fp16_ops_[1]));
    MPIDDP_CHECK_MPI(MPI_Op_create(&max_fn<c10::Half>, 1, &fp16_ops_[2]));
  }

  ~MpiProcessGroup() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (auto* ops : {bf16_ops_, fp16_ops_}) {
      for (int i = 0; i < 3; ++i) MPI_Op_free(&ops[i]);
    }
    MPI_Type_free(&half_type_);
    MPI_Comm_free(&comm_);
  }

  std::string backend() const override { return "mpi"; }
  // Open MPI's MPI_Ireduce_scatter_block (coll/libnbc, 4.x and 5.x) keeps two buffers of the whole
  // input until it completes (nbc_ireduce_scatter_block.c: a binomial reduce, then a scatter);
  // another MPI's is assumed to keep one.
  int64_t reduce_scatter_scratch_bytes(int64_t input_bytes) const override {
#if defined(OPEN_MPI) && OPEN_MPI
    return 2 * input_bytes;
#else
    return input_bytes;
#endif
  }
  bool cuda_aware() const { return cuda_aware_; }

 protected:
  void check_device(const c10::Device& device, const std::string& what) const override {
    // CUDA tensors go to a CUDA-aware MPI directly, through host memory otherwise (launch_staged).
    MPIDDP_CHECK(device.is_cpu() || device.is_cuda(),
                 what + ": the mpi backend takes CPU or CUDA tensors, got one on " + device.str());
  }

  WorkHandle launch(const Call& c) override {
    // Reductions run their operator on the host (ours for bf16/fp16; Open MPI's non-blocking
    // collectives do not stage device buffers for it), so they are staged even where MPI is
    // CUDA-aware; data movement alone goes to a CUDA-aware MPI directly.
    const auto& t = traits(c.kind);
    if (t.has_data() && (options().stage_through_host || (c.input.is_cuda() && (!cuda_aware_ || t.reduces)))) {
      return launch_staged(c);
    }
    return launch_host(c, {}, nullptr);
  }

 private:
  // Without a CUDA-aware MPI a CUDA tensor travels through host memory: the input is copied out
  // before the collective starts (the copy waits for the kernels that wrote it) and the result
  // copied back when it completes. The host call is always out of place, whatever the caller's
  // layout, so one rule covers every collective.
  WorkHandle launch_staged(const Call& c) {
    Call host = c;
    host.input = c.input.to(torch::kCPU);
    host.output = torch::empty(c.output.sizes(), c.output.options().device(torch::kCPU));
    host.in_place = false;
    torch::Tensor device_out = c.output, host_out = host.output;
    return launch_host(host, {c.input, c.output}, [device_out, host_out] { device_out.copy_(host_out); });
  }

  // Starts `c` on host-addressable (or, for a CUDA-aware MPI, device) memory. `keep` lives until
  // completion; `after` runs on completion, after the collective's own finishing step.
  WorkHandle launch_host(const Call& c, std::vector<torch::Tensor> keep, std::function<void()> after) {
    MPI_Request req = MPI_REQUEST_NULL;
    const auto timeout = options().timeout;
    if (c.kind == Collective::kBarrier) {
      MPIDDP_CHECK_MPI(MPI_Ibarrier(comm_, &req));
      return std::make_unique<MpiWork>(c, timeout, req, std::move(keep), std::move(after));
    }
    const MPI_Datatype type = datatype(c.input.scalar_type());
#if MPIDDP_HAS_CUDA
    // CUDA-aware MPI reads device memory directly: kernels producing it must have finished.
    if (c.input.is_cuda()) MPIDDP_CHECK_CUDA(cudaDeviceSynchronize());
#endif
    const int n = size();
    std::function<void()> finish;  // the collective's own finishing step, before `after`
    switch (c.kind) {
      case Collective::kAllreduce: {
        const int count = checked_count(c.input.numel());
        MPIDDP_CHECK_MPI(MPI_Iallreduce(c.in_place ? MPI_IN_PLACE : c.input.data_ptr(), c.output.data_ptr(), count,
                                        type, mpi_op(c.op, c.input.scalar_type()), comm_, &req));
        break;
      }
      case Collective::kBroadcast: {
        if (!c.in_place && rank() == c.root) c.output.copy_(c.input);
        MPIDDP_CHECK_MPI(MPI_Ibcast(c.output.data_ptr(), checked_count(c.output.numel()), type, c.root, comm_, &req));
        break;
      }
      case Collective::kAllgather: {
        const int count = checked_count(c.input.numel());
        MPIDDP_CHECK_MPI(MPI_Iallgather(c.in_place ? MPI_IN_PLACE : c.input.data_ptr(), count, type,
                                        c.output.data_ptr(), count, type, comm_, &req));
        break;
      }
      case Collective::kReduceScatter: {
        const int count = checked_count(c.output.numel());
        checked_count(c.input.numel());
        // MPI's in-place layout differs from nccl-tests' (output = this rank's slice of the
        // input), so an in-place call receives into a scratch buffer.
        torch::Tensor target = c.in_place ? torch::empty_like(c.output) : c.output;
        keep.push_back(target);
        MPIDDP_CHECK_MPI(MPI_Ireduce_scatter_block(c.input.data_ptr(), target.data_ptr(), count, type,
                                                   mpi_op(c.op, c.input.scalar_type()), comm_, &req));
        if (c.in_place) {
          torch::Tensor out = c.output;
          finish = [out, target] { out.copy_(target); };
        }
        break;
      }
      case Collective::kAlltoall: {
        const int count = checked_count(c.input.numel() / n);
        torch::Tensor source = c.in_place ? c.input.clone() : c.input;
        keep.push_back(source);
        MPIDDP_CHECK_MPI(MPI_Ialltoall(source.data_ptr(), count, type, c.output.data_ptr(), count, type, comm_, &req));
        break;
      }
      case Collective::kBarrier:
        break;
    }
    if (after && finish) {
      finish = [own = std::move(finish), after = std::move(after)] {
        own();
        after();
      };
    } else if (after) {
      finish = std::move(after);
    }
    return std::make_unique<MpiWork>(c, timeout, req, std::move(keep), std::move(finish));
  }

  static int checked_count(int64_t n) {
    MPIDDP_CHECK(n <= INT_MAX,
                 "mpi backend: " + std::to_string(n) + " elements exceed MPI's int count; split the tensor");
    return static_cast<int>(n);
  }

  MPI_Datatype datatype(c10::ScalarType t) const {
    switch (t) {
      case c10::kFloat:
        return MPI_FLOAT;
      case c10::kDouble:
        return MPI_DOUBLE;
      case c10::kInt:
        return MPI_INT32_T;
      case c10::kLong:
        return MPI_INT64_T;
      case c10::kBFloat16:
      case c10::kHalf:
        return half_type_;
      default:
        MPIDDP_THROW("mpi backend: no MPI type for " + dtype_name(t));
    }
  }

  MPI_Op mpi_op(ReduceOp op, c10::ScalarType t) const {
    const int i = op == ReduceOp::kMin ? 1 : op == ReduceOp::kMax ? 2 : 0;  // avg = sum, then divide
    if (t == c10::kBFloat16) return bf16_ops_[i];
    if (t == c10::kHalf) return fp16_ops_[i];
    return i == 1 ? MPI_MIN : i == 2 ? MPI_MAX : MPI_SUM;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Datatype half_type_ = MPI_DATATYPE_NULL;
  MPI_Op bf16_ops_[3] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  MPI_Op fp16_ops_[3] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  bool cuda_aware_ = false;
};

}  // namespace

std::unique_ptr<ProcessGroup> make_mpi_group(const Runtime& runtime, const CommOptions& options) {
  return std::make_unique<MpiProcessGroup>(runtime, options);
}

}  // namespace mpiddp::detail
