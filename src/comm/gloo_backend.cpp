// The gloo backend: libtorch's c10d::ProcessGroupGloo on CPU tensors, for comparison and
// interoperability. Its TCPStore is bootstrapped over MPI: rank 0 opens it on a free port and
// broadcasts the address; no MASTER_ADDR/MASTER_PORT.
#include <mpiddp/compat.hpp>
#include <mpiddp/error.hpp>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/backend_factories.hpp"
#include "comm/served_store.hpp"
#include "comm/work.hpp"
#include "common/check.hpp"

namespace mpiddp::detail {
namespace {

c10d::ReduceOp gloo_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin:
      return c10d::ReduceOp::MIN;
    case ReduceOp::kMax:
      return c10d::ReduceOp::MAX;
    default:
      return c10d::ReduceOp::SUM;  // avg = sum, then divide (c10d's Gloo has no AVG)
  }
}

class GlooWork : public PollingWork {
 public:
  GlooWork(const ProcessGroup::Call& call, std::chrono::milliseconds timeout, c10::intrusive_ptr<c10d::Work> work,
           std::vector<torch::Tensor> keep, std::function<void()> finish)
      : PollingWork(call, timeout, std::move(keep), std::move(finish)), work_(std::move(work)) {}
  ~GlooWork() override { settle(); }

 protected:
  bool poll() override {
    if (!work_->isCompleted()) return false;
    if (auto e = work_->exception()) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        MPIDDP_THROW("gloo: " + what() + " failed: " + x.what());
      }
    }
    return true;
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
};

class GlooProcessGroup : public ProcessGroup {
 public:
  GlooProcessGroup(const Runtime& runtime, const CommOptions& options) : ProcessGroup(runtime, options) {
    // Rank 0 serves the store on a port the kernel picks; everyone learns host and port by MPI.
    const std::string host = runtime.node_count() == 1 ? "127.0.0.1" : runtime.hostnames()[0];
    const ServedStore served = serve_store(runtime, host, runtime.size(), options.timeout, "gloo backend");
    c10::intrusive_ptr<c10d::Store> store = served.server;
    if (runtime.rank() != 0) {
      c10d::TCPStoreOptions so;
      so.timeout = options.timeout;
      compat::use_classic_tcp_store(so);
      so.port = static_cast<uint16_t>(served.port);
      so.isServer = false;
      store = c10::make_intrusive<c10d::TCPStore>(host, so);
    }
    auto gopts = c10d::ProcessGroupGloo::Options::create(options.timeout);
    gopts->devices.push_back(runtime.node_count() == 1 ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                                       : c10d::ProcessGroupGloo::createDefaultDevice());
    pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store, runtime.rank(), runtime.size(), gopts);
  }

  std::string backend() const override { return "gloo"; }
  // A reduce-scatter is an all-reduce of a copy of the input (launch).
  int64_t reduce_scatter_scratch_bytes(int64_t input_bytes) const override { return input_bytes; }

  bool supports(Collective c, c10::ScalarType dtype, ReduceOp op) const override {
    // What the linked gloo reduces (and so sends: c10d dispatches every collective on the dtype).
    if (dtype == c10::kBFloat16 && !MPIDDP_GLOO_HAS_BFLOAT16) return false;
    if (dtype == c10::kHalf && !MPIDDP_GLOO_HAS_HALF) return false;
    return ProcessGroup::supports(c, dtype, op);
  }

 protected:
  void check_device(const c10::Device& device, const std::string& what) const override {
    MPIDDP_CHECK(device.is_cpu(), what + ": the gloo backend takes CPU tensors, got one on " + device.str());
  }

  WorkHandle launch(const Call& c) override {
    std::vector<torch::Tensor> keep = {c.input, c.output};
    std::function<void()> finish;
    c10::intrusive_ptr<c10d::Work> work;
    const int n = size();
    try {
      switch (c.kind) {
        case Collective::kBarrier:
          work = pg_->barrier(c10d::BarrierOptions());
          break;
        case Collective::kAllreduce: {
          if (!c.in_place) c.output.copy_(c.input);
          std::vector<at::Tensor> v = {c.output};
          c10d::AllreduceOptions o;
          o.reduceOp = gloo_op(c.op);
          work = pg_->allreduce(v, o);
          break;
        }
        case Collective::kBroadcast: {
          if (!c.in_place && rank() == c.root) c.output.copy_(c.input);
          std::vector<at::Tensor> v = {c.output};
          c10d::BroadcastOptions o;
          o.rootRank = c.root;
          work = pg_->broadcast(v, o);
          break;
        }
        case Collective::kAllgather: {
          std::vector<std::vector<at::Tensor>> outs = {c.output.view(-1).chunk(n)};
          std::vector<at::Tensor> ins = {c.in_place ? c.input.view(-1).clone() : c.input.view(-1)};
          keep.push_back(ins[0]);
          work = pg_->allgather(outs, ins, c10d::AllgatherOptions());
          break;
        }
        case Collective::kReduceScatter: {
          // c10d's Gloo has no reduce_scatter: an allreduce of a copy, then this rank's slice.
          torch::Tensor tmp = c.input.view(-1).clone();
          keep.push_back(tmp);
          std::vector<at::Tensor> v = {tmp};
          c10d::AllreduceOptions o;
          o.reduceOp = gloo_op(c.op);
          work = pg_->allreduce(v, o);
          torch::Tensor out = c.output;
          const int64_t count = c.output.numel();
          const int64_t offset = count * rank();
          finish = [out, tmp, count, offset] { out.view(-1).copy_(tmp.narrow(0, offset, count)); };
          break;
        }
        case Collective::kAlltoall: {
          torch::Tensor source = c.in_place ? c.input.clone() : c.input;
          keep.push_back(source);
          std::vector<int64_t> equal;  // empty split sizes: equal slices
          torch::Tensor out = c.output;
          work = pg_->alltoall_base(out, source, equal, equal, c10d::AllToAllOptions());
          break;
        }
      }
    } catch (const c10::Error& e) {
      MPIDDP_THROW("gloo: " + c.describe() + " failed: " + e.what_without_backtrace());
    }
    return std::make_unique<GlooWork>(c, options().timeout, std::move(work), std::move(keep), std::move(finish));
  }

 private:
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
};

}  // namespace

std::unique_ptr<ProcessGroup> make_gloo_group(const Runtime& runtime, const CommOptions& options) {
  return std::make_unique<GlooProcessGroup>(runtime, options);
}

}  // namespace mpiddp::detail
