#include <mpiddp/config.hpp>
#include <mpiddp/error.hpp>
#include <mpiddp/process_group.hpp>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include "comm/backend_factories.hpp"
#include "comm/names.hpp"
#include "comm/work.hpp"
#include "common/check.hpp"
#include "common/text.hpp"
#include "runtime/stall.hpp"
#include "runtime/wait.hpp"

namespace mpiddp {

// ---- names ---------------------------------------------------------------------------------

namespace {

const std::vector<std::pair<ReduceOp, std::string>> kOpNames = {
    {ReduceOp::kSum, "sum"}, {ReduceOp::kAvg, "avg"}, {ReduceOp::kMin, "min"}, {ReduceOp::kMax, "max"}};
const std::vector<std::pair<c10::ScalarType, std::string>> kDtypeNames = {
    {c10::kFloat, "float32"}, {c10::kDouble, "float64"}, {c10::kBFloat16, "bfloat16"},
    {c10::kHalf, "float16"},  {c10::kInt, "int32"},      {c10::kLong, "int64"}};

template <typename E>
std::string name_of(const std::vector<std::pair<E, std::string>>& table, E value) {
  for (const auto& [v, n] : table) {
    if (v == value) return n;
  }
  return "?";
}

template <typename E>
E parse_name(const std::vector<std::pair<E, std::string>>& table, const std::string& name, const char* what) {
  std::string accepted;
  for (const auto& [v, n] : table) {
    if (n == name) return v;
    accepted += (accepted.empty() ? "" : "|") + n;
  }
  MPIDDP_THROW(std::string("unknown ") + what + " '" + name + "' (expected " + accepted + ")");
}

}  // namespace

std::string to_string(ReduceOp op) { return name_of(kOpNames, op); }
std::string to_string(Collective c) { return traits(c).name; }
ReduceOp parse_reduce_op(const std::string& name) { return parse_name(kOpNames, name, "reduction op"); }
Collective parse_collective(const std::string& name) {
  std::vector<std::pair<Collective, std::string>> names;
  for (const auto& t : collectives()) names.emplace_back(t.kind, t.name);
  return parse_name(names, name, "collective");
}
c10::ScalarType parse_dtype(const std::string& name) { return parse_name(kDtypeNames, name, "dtype"); }

namespace detail {
std::vector<ReduceOp> reduce_ops() {
  std::vector<ReduceOp> ops;
  for (const auto& named : kOpNames) ops.push_back(named.first);
  return ops;
}
std::vector<c10::ScalarType> collective_dtypes() {
  std::vector<c10::ScalarType> dtypes;
  for (const auto& named : kDtypeNames) dtypes.push_back(named.first);
  return dtypes;
}
}  // namespace detail
std::string dtype_name(c10::ScalarType t) {
  std::string n = name_of(kDtypeNames, t);
  return n == "?" ? std::string(c10::toString(t)) : n;
}
bool is_supported_dtype(c10::ScalarType t) {
  switch (t) {  // on every collective's path: no string work here
    case c10::kFloat:
    case c10::kDouble:
    case c10::kBFloat16:
    case c10::kHalf:
    case c10::kInt:
    case c10::kLong:
      return true;
    default:
      return false;
  }
}

// ---- Work ----------------------------------------------------------------------------------

namespace detail {

namespace {
// Set by the first collective that times out: the job is ending (the caller aborts it), so a
// handle dropped while that error unwinds must not wait a second timeout for its own transfer.
std::atomic<bool> g_timed_out{false};
}  // namespace

PollingWork::PollingWork(const ProcessGroup::Call& call, std::chrono::milliseconds timeout,
                         std::vector<torch::Tensor> keep, std::function<void()> finish)
    : call_(call),
      site_{call_.seq, [this] { return call_.describe(); }},
      timeout_(timeout),
      start_(std::chrono::steady_clock::now()),
      keep_(std::move(keep)),
      finish_(std::move(finish)) {}

bool PollingWork::test() {
  if (failure_) std::rethrow_exception(failure_);
  if (completed_) return true;
  try {
    if (!poll()) return false;
    complete();
  } catch (...) {
    failure_ = std::current_exception();
    throw;
  }
  return true;
}

void PollingWork::complete() {
  if (finish_) finish_();
  completed_ = true;
  keep_.clear();
  if (call_.stall) call_.stall->on_done(site_);
}

void PollingWork::wait_on_device() {
  if (failure_) std::rethrow_exception(failure_);
  if (completed_) return;
  try {
    if (hand_to_device()) {
      MPIDDP_CHECK(!finish_, what() + ": a collective with a finishing step on the host was handed to the device");
      complete();
      return;
    }
  } catch (...) {
    failure_ = std::current_exception();
    throw;
  }
  wait();
}

void PollingWork::wait() {
  // The waiting policy is detail::wait_until's (runtime/wait.hpp); here the stall monitor hears of
  // the wait and the timeout ends it.
  detail::wait_until([this] { return test(); }, start_,
                     [this](std::chrono::steady_clock::duration waited) {
                       if (call_.stall) call_.stall->on_wait(site_, waited);
                       if (waited > timeout_) {
                         on_timeout();
                         std::ostringstream msg;
                         msg << what() << " did not complete within " << static_cast<double>(timeout_.count()) / 1000.0
                             << " s: " << who_is_missing();
                         g_timed_out = true;
                         CollectiveTimeout error(msg.str(), __FILE__, __LINE__);
                         if (call_.stall) error.set_reporter(call_.stall->reports_timeout(site_));
                         failure_ = std::make_exception_ptr(error);
                         std::rethrow_exception(failure_);
                       }
                     });
}

std::string PollingWork::who_is_missing() {
  if (call_.stall) return call_.stall->behind_at_timeout(site_);
  return "the late ranks are not named (the stall monitor is off: MPIDDP_STALL_WARNING=off)";
}

void PollingWork::settle() noexcept {
  if (completed_ || failure_) return;  // nothing in flight, or the caller has the error
  if (g_timed_out) {
    // Another collective timed out and its error is on its way to end the job: leave this one
    // posted, and its buffers alive for as long as the process lives.
    static std::vector<torch::Tensor> abandoned;
    abandoned.insert(abandoned.end(), keep_.begin(), keep_.end());
    abandoned.push_back(call_.input);
    abandoned.push_back(call_.output);
    return;
  }
  try {
    wait();
  } catch (const CollectiveMismatch&) {
    // Every rank refused it before launching: nothing is in flight.
  } catch (const std::exception& e) {
    std::cerr << "mpiddp: fatal: " << e.what() << " (while discarding its handle); aborting the job" << std::endl;
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

}  // namespace detail

// ---- check mode ----------------------------------------------------------------------------

namespace {

constexpr int kMaxDims = 8;
constexpr int kDescriptorTag = 7;

// What one rank says it is about to do; exchanged as raw bytes between identical binaries.
struct Descriptor {
  uint64_t seq;
  int32_t kind, dtype, op, root, ndim;
  int64_t in_numel, out_numel;
  int64_t shape[kMaxDims];

  bool same_as(const Descriptor& o) const {
    return seq == o.seq && kind == o.kind && dtype == o.dtype && op == o.op && root == o.root && ndim == o.ndim &&
           in_numel == o.in_numel && out_numel == o.out_numel &&
           std::equal(shape, shape + std::min(ndim, kMaxDims), o.shape);
  }
  std::string describe() const {
    std::ostringstream s;
    const auto k = static_cast<Collective>(kind);
    s << to_string(k);
    if (!traits(k).has_data()) return s.str();
    s << "(" << dtype_name(static_cast<c10::ScalarType>(dtype)) << "[";
    for (int i = 0; i < std::min(ndim, kMaxDims); ++i) s << (i ? "," : "") << shape[i];
    s << "]";
    if (traits(k).reduces) s << ", " << to_string(static_cast<ReduceOp>(op));
    if (traits(k).rooted) s << ", root " << root;
    s << ")";
    return s.str();
  }
};

Descriptor describe(const ProcessGroup::Call& c) {
  Descriptor d{};
  d.seq = c.seq;
  d.kind = static_cast<int32_t>(c.kind);
  const auto& t = traits(c.kind);
  d.op = t.reduces ? static_cast<int32_t>(c.op) : 0;
  d.root = t.rooted ? c.root : 0;
  if (t.has_data()) {
    d.dtype = static_cast<int32_t>(c.input.scalar_type());
    d.ndim = static_cast<int32_t>(c.input.dim());
    for (int i = 0; i < std::min(d.ndim, kMaxDims); ++i) d.shape[i] = c.input.size(i);
    d.in_numel = c.input.numel();
    d.out_numel = c.output.numel();
  }
  return d;
}

}  // namespace

// Check mode: every collective's descriptor goes to every peer before the collective is launched.
// Launches happen strictly in issue order (a later collective never overtakes an earlier one whose
// descriptors are still in flight), so every rank launches the same sequence.
struct ProcessGroup::Checker {
  struct Pending {
    Call call;
    Descriptor mine{};
    std::vector<Descriptor> theirs;
    std::vector<MPI_Request> recvs, sends;
    std::vector<bool> arrived;
    bool exchanged = false;
    WorkHandle inner;
    std::exception_ptr error;
  };

  ProcessGroup* pg;
  MPI_Comm comm;
  std::deque<std::shared_ptr<Pending>> queue;

  std::shared_ptr<Pending> post(Call call) {
    auto p = std::make_shared<Pending>();
    p->mine = describe(call);
    p->call = std::move(call);
    const int n = pg->size(), me = pg->rank();
    p->theirs.assign(static_cast<size_t>(n), Descriptor{});
    p->theirs[static_cast<size_t>(me)] = p->mine;
    p->arrived.assign(static_cast<size_t>(n), false);
    p->arrived[static_cast<size_t>(me)] = true;
    for (int r = 0; r < n; ++r) {
      if (r == me) continue;
      MPI_Request rq;
      MPIDDP_CHECK_MPI(
          MPI_Irecv(&p->theirs[static_cast<size_t>(r)], sizeof(Descriptor), MPI_BYTE, r, kDescriptorTag, comm, &rq));
      p->recvs.push_back(rq);
      MPIDDP_CHECK_MPI(MPI_Isend(&p->mine, sizeof(Descriptor), MPI_BYTE, r, kDescriptorTag, comm, &rq));
      p->sends.push_back(rq);
    }
    queue.push_back(p);
    progress();
    return p;
  }

  void progress() {
    while (!queue.empty()) {
      auto& p = *queue.front();
      if (!exchange_done(p)) return;
      p.exchanged = true;
      try {
        check_agreement(p);
        p.inner = pg->start(p.call);
      } catch (...) {
        p.error = std::current_exception();
      }
      queue.pop_front();
    }
  }

  bool exchange_done(Pending& p) {
    const int me = pg->rank();
    bool all = true;
    for (size_t i = 0, r = 0; r < p.arrived.size(); ++r) {
      if (static_cast<int>(r) == me) continue;
      if (!p.arrived[r]) {
        int flag = 0;
        MPIDDP_CHECK_MPI(MPI_Test(&p.recvs[i], &flag, MPI_STATUS_IGNORE));
        p.arrived[r] = flag != 0;
      }
      all = all && p.arrived[r];
      ++i;
    }
    if (!all) return false;
    int flag = 0;
    MPIDDP_CHECK_MPI(MPI_Testall(static_cast<int>(p.sends.size()), p.sends.data(), &flag, MPI_STATUSES_IGNORE));
    return flag != 0;
  }

  // Every rank holds every descriptor, so every rank reaches the same verdict and none launches.
  void check_agreement(const Pending& p) {
    std::map<std::string, std::vector<int>> ranks_by_call;
    bool same = true;
    for (size_t r = 0; r < p.theirs.size(); ++r) {
      same = same && p.theirs[r].same_as(p.theirs[0]);
      ranks_by_call[p.theirs[r].describe()].push_back(static_cast<int>(r));
    }
    if (same) return;
    std::string msg = "collective mismatch at #" + std::to_string(p.mine.seq) + ":";
    for (const auto& [call, ranks] : ranks_by_call) msg += " " + detail::rank_list(ranks) + " issued " + call + ";";
    msg.pop_back();
    throw CollectiveMismatch(msg, __FILE__, __LINE__);
  }

  std::string missing(const Pending& p) const {
    std::vector<int> late;
    for (size_t r = 0; r < p.arrived.size(); ++r) {
      if (!p.arrived[r]) late.push_back(static_cast<int>(r));
    }
    if (late.empty()) return "every rank arrived; the collective itself stalled (a rank may have died)";
    return detail::rank_list(late) + (late.size() == 1 ? " has" : " have") + " not arrived";
  }
};

namespace {

class CheckedWork : public detail::PollingWork {
 public:
  CheckedWork(std::shared_ptr<ProcessGroup::Checker> checker, std::shared_ptr<ProcessGroup::Checker::Pending> p,
              std::chrono::milliseconds timeout)
      : PollingWork(p->call, timeout), checker_(std::move(checker)), p_(std::move(p)) {}
  ~CheckedWork() override { settle(); }

 protected:
  bool poll() override {
    checker_->progress();
    if (p_->error) std::rethrow_exception(p_->error);
    return p_->inner && p_->inner->test();
  }
  std::string who_is_missing() override { return checker_->missing(*p_); }
  bool hand_to_device() override {
    // The descriptor exchange is the host's to drive: polled while the other ranks are a moment
    // behind (kSleepAfter, when a wait is deemed long); then the launched collective's handle takes
    // the device's wait. Ranks further apart: wait(), with its stall warnings and timeout.
    const auto start = std::chrono::steady_clock::now();
    do {
      checker_->progress();
      if (p_->error) std::rethrow_exception(p_->error);
      if (p_->inner) {
        p_->inner->wait_on_device();
        return true;
      }
    } while (std::chrono::steady_clock::now() - start < detail::kSleepAfter);
    return false;
  }

 private:
  std::shared_ptr<ProcessGroup::Checker> checker_;
  std::shared_ptr<ProcessGroup::Checker::Pending> p_;
};

}  // namespace

// ---- ProcessGroup --------------------------------------------------------------------------

std::string ProcessGroup::Call::describe() const {
  Descriptor d = mpiddp::describe(*this);
  std::string s = d.describe();
  auto paren = s.find('(');
  std::string head = paren == std::string::npos ? s : s.substr(0, paren);
  std::string tail = paren == std::string::npos ? "" : " " + s.substr(paren);
  return head + " #" + std::to_string(seq) + tail;
}

ProcessGroup::ProcessGroup(const Runtime& runtime, CommOptions options)
    : runtime_(runtime), options_(options), rank_(runtime.rank()), size_(runtime.size()) {
  {
    BlockingCall watch("process group set-up (its control communicator, MPI_Comm_dup)", options_.timeout);
    MPIDDP_CHECK_MPI(MPI_Comm_dup(runtime.world(), &control_));
  }
  MPIDDP_CHECK_MPI(MPI_Comm_set_errhandler(control_, MPI_ERRORS_RETURN));
  if (size_ > 1 && options_.stall_monitor)
    stall_ = std::make_shared<detail::StallMonitor>(control_, rank_, size_, options_.stall_warning);
  if (options_.check_collectives) {
    checker_ = std::make_shared<Checker>();
    checker_->pg = this;
    checker_->comm = control_;
  }
}

ProcessGroup::~ProcessGroup() {
  stall_.reset();  // before its communicator goes
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (control_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&control_);
}

bool ProcessGroup::supports(Collective c, c10::ScalarType dtype, ReduceOp op) const {
  if (!traits(c).has_data()) return true;
  if (!is_supported_dtype(dtype)) return false;
  // An average of integers is not an integer; PyTorch's NCCL and Gloo refuse it as well.
  return !(traits(c).reduces && op == ReduceOp::kAvg && !c10::isFloatingType(dtype));
}

void ProcessGroup::validate(const Call& c) const {
  const auto& t = traits(c.kind);
  if (!t.has_data()) return;
  const std::string what = t.name;
  MPIDDP_CHECK(c.input.defined() && c.output.defined(), what + ": undefined tensor");
  const auto dtype = c.input.scalar_type();
  MPIDDP_CHECK(is_supported_dtype(dtype), what + ": unsupported dtype " + dtype_name(dtype) +
                                              " (collectives take float32, float64, bfloat16, float16, int32, int64)");
  MPIDDP_CHECK(c.output.scalar_type() == dtype,
               what + ": input is " + dtype_name(dtype) + " but output is " + dtype_name(c.output.scalar_type()));
  MPIDDP_CHECK(c.input.is_contiguous() && c.output.is_contiguous(),
               what + ": tensors must be contiguous (call .contiguous() first)");
  MPIDDP_CHECK(c.input.device() == c.output.device(),
               what + ": input on " + c.input.device().str() + " but output on " + c.output.device().str());
  check_device(c.input.device(), what);
  MPIDDP_CHECK(supports(c.kind, dtype, c.op), backend() + " does not support " + what + " of " + dtype_name(dtype) +
                                                  (t.reduces ? " with " + to_string(c.op) : std::string()));
  const int64_t n = size_, in = c.input.numel(), out = c.output.numel();
  switch (t.counts) {
    case CountRule::kSame:
      MPIDDP_CHECK(in == out,
                   what + ": input has " + std::to_string(in) + " elements but output " + std::to_string(out));
      break;
    case CountRule::kGather:
      MPIDDP_CHECK(out == in * n, what + ": output needs world size x input = " + std::to_string(in * n) +
                                      " elements, has " + std::to_string(out));
      break;
    case CountRule::kScatter:
      MPIDDP_CHECK(in == out * n, what + ": input needs world size x output = " + std::to_string(out * n) +
                                      " elements, has " + std::to_string(in));
      break;
    case CountRule::kExchange:
      MPIDDP_CHECK(in == out && in % n == 0, what +
                                                 ": input and output need the same element count, divisible by "
                                                 "the world size " +
                                                 std::to_string(n) + "; got " + std::to_string(in) + " and " +
                                                 std::to_string(out));
      break;
    case CountRule::kNone:
      break;
  }
  MPIDDP_CHECK(!t.rooted || (c.root >= 0 && c.root < size_),
               what + ": root " + std::to_string(c.root) + " outside a world of " + std::to_string(size_));
}

namespace {

// Where `part` lies inside `whole`, in elements, or -1 if it is not a slice of it.
int64_t offset_within(const torch::Tensor& part, const torch::Tensor& whole) {
  if (part.numel() == 0 || whole.numel() == 0) return -1;
  const auto* p = static_cast<const char*>(part.data_ptr());
  const auto* w = static_cast<const char*>(whole.data_ptr());
  const auto bytes = static_cast<int64_t>(whole.element_size());
  if (p < w || p >= w + whole.numel() * bytes) return -1;
  return (p - w) / bytes;
}

}  // namespace

namespace {

// Divides the output by the world size once the summing collective underneath has completed.
class AveragingWork : public Work {
 public:
  AveragingWork(WorkHandle sum, torch::Tensor output, int n)
      : sum_(std::move(sum)), output_(std::move(output)), n_(n) {}
  bool test() override {
    if (!done_ && sum_->test()) divide();
    return done_;
  }
  void wait() override {
    sum_->wait();
    if (!done_) divide();
  }
  void wait_on_device() override {  // the division is the device's next work
    sum_->wait_on_device();
    if (!done_) divide();
  }

 private:
  void divide() {
    output_.div_(n_);
    done_ = true;
  }
  WorkHandle sum_;
  torch::Tensor output_;
  int n_;
  bool done_ = false;
};

}  // namespace

WorkHandle ProcessGroup::start(const Call& call) {
  if (!traits(call.kind).reduces || call.op != ReduceOp::kAvg || averages_natively()) return launch(call);
  return std::make_unique<AveragingWork>(launch(call), call.output, size_);
}

WorkHandle ProcessGroup::issue(Call call) {
  validate(call);
  call.seq = ++seq_;
  call.stall = stall_;
  switch (traits(call.kind).counts) {
    case CountRule::kGather:  // input is this rank's slice of the output
      call.in_place = offset_within(call.input, call.output) == rank_ * call.input.numel();
      break;
    case CountRule::kScatter:  // output is this rank's slice of the input
      call.in_place = offset_within(call.output, call.input) == rank_ * call.output.numel();
      break;
    case CountRule::kSame:
    case CountRule::kExchange:
      call.in_place = call.input.numel() > 0 && call.input.data_ptr() == call.output.data_ptr();
      break;
    case CountRule::kNone:
      break;
  }
  if (!checker_) return start(call);
  auto pending = checker_->post(std::move(call));
  return std::make_unique<CheckedWork>(checker_, pending, options_.timeout);
}

namespace {

ProcessGroup::Call make_call(Collective kind, const torch::Tensor& input, const torch::Tensor& output,
                             ReduceOp op = ReduceOp::kSum, int root = 0) {
  ProcessGroup::Call c;
  c.kind = kind;
  c.input = input;
  c.output = output;
  c.op = op;
  c.root = root;
  return c;
}

}  // namespace

WorkHandle ProcessGroup::allreduce_async(const torch::Tensor& input, const torch::Tensor& output, ReduceOp op) {
  return issue(make_call(Collective::kAllreduce, input, output, op));
}

WorkHandle ProcessGroup::broadcast_async(const torch::Tensor& input, const torch::Tensor& output, int root) {
  return issue(make_call(Collective::kBroadcast, input, output, ReduceOp::kSum, root));
}

WorkHandle ProcessGroup::allgather_async(const torch::Tensor& input, const torch::Tensor& output) {
  return issue(make_call(Collective::kAllgather, input, output));
}

WorkHandle ProcessGroup::reduce_scatter_async(const torch::Tensor& input, const torch::Tensor& output, ReduceOp op) {
  return issue(make_call(Collective::kReduceScatter, input, output, op));
}

WorkHandle ProcessGroup::alltoall_async(const torch::Tensor& input, const torch::Tensor& output) {
  return issue(make_call(Collective::kAlltoall, input, output));
}

WorkHandle ProcessGroup::barrier_async() { return issue(make_call(Collective::kBarrier, {}, {})); }

}  // namespace mpiddp
