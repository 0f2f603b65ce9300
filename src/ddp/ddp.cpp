#include <mpiddp/ddp.hpp>
#include <mpiddp/error.hpp>
#include <mpiddp/units.hpp>

#include <torch/csrc/autograd/engine.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <utility>

#include "common/distinct.hpp"

namespace mpiddp {

std::vector<BucketLayout> assign_buckets(const std::vector<int64_t>& numels, const std::vector<c10::ScalarType>& dtypes,
                                         int64_t cap_bytes, int64_t first_cap_bytes, const std::vector<int>& group_of) {
  MPIDDP_CHECK(numels.size() == dtypes.size(), "assign_buckets: numels and dtypes differ in length");
  MPIDDP_CHECK(group_of.empty() || group_of.size() == numels.size(),
               "assign_buckets: group_of and numels differ in length");
  MPIDDP_CHECK(cap_bytes > 0 && first_cap_bytes > 0, "bucket caps must be > 0 bytes");
  std::vector<BucketLayout> out;
  int64_t bytes = 0;
  for (size_t k = numels.size(); k-- > 0;) {  // reverse registration order
    const int64_t size = numels[k] * static_cast<int64_t>(c10::elementSize(dtypes[k]));
    // The bucket being filled is the first one while exactly one exists.
    const int64_t current_cap = out.size() == 1 ? first_cap_bytes : cap_bytes;
    const int group = group_of.empty() ? -1 : group_of[k];
    const bool fits =
        !out.empty() && out.back().dtype == dtypes[k] && out.back().group == group && bytes + size <= current_cap;
    if (!fits) {
      out.push_back(BucketLayout{});
      out.back().dtype = dtypes[k];
      out.back().group = group;
      bytes = 0;
    }
    BucketLayout& b = out.back();
    b.params.push_back(k);
    b.offsets.push_back(b.numel);
    b.numel += numels[k];
    b.padded = b.numel;
    bytes += size;
  }
  return out;
}

struct DistributedDataParallel::GradientReady : torch::autograd::FunctionPostHook {
  GradientReady(DistributedDataParallel* ddp, size_t param) : ddp_(ddp), param_(param) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    ddp_->on_gradient(param_);
    return outputs;
  }
  DistributedDataParallel* ddp_;
  size_t param_;
};

struct DistributedDataParallel::Bucket {
  BucketLayout layout;
  GradientReduction* reduction = nullptr;  ///< reduction_, or tail_reduction_ for a lone mean tail
  size_t index = 0;                        ///< the bucket's index in its reduction
  bool keeps_buffer = true;                ///< reduction->keeps_buffer()
  torch::TensorOptions options;
  torch::Tensor flat;       ///< gradients of this bucket, in layout order (transient: while reduced)
  std::vector<bool> ready;  ///< per slot: gradient copied in this step
  size_t pending = 0;       ///< slots still missing
  WorkHandle work;
  Timeline::Clock::time_point launched{};
  Timeline::Clock::time_point completed{};  ///< when a poll first saw it done (zero: not yet)
};

namespace {

// The start-up broadcast of rank 0's parameters and buffers packs tensors into chunks of at most
// this many bytes (DDP's default bucket).
constexpr int64_t kBroadcastChunkBytes = kDefaultBucketCapBytes;

std::string describe_param(const std::string& name, const torch::Tensor& t) {
  std::ostringstream s;
  s << name << ":" << dtype_name(t.scalar_type()) << "[";
  for (int64_t i = 0; i < t.dim(); ++i) s << (i ? "," : "") << t.size(i);
  s << "]";
  return s.str();
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

}  // namespace

namespace {
std::vector<std::pair<std::string, torch::Tensor>> named(const torch::OrderedDict<std::string, torch::Tensor>& d) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : d) out.emplace_back(item.key(), item.value());
  return out;
}
}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, ProcessGroup& pg,
                                                 DdpOptions options)
    : module_(std::move(module)), pg_(pg), options_(std::move(options)) {
  MPIDDP_CHECK(module_, "DistributedDataParallel needs a module");
  setup(named(module_->named_parameters(/*recurse=*/true)), named(module_->named_buffers(/*recurse=*/true)));
}

DistributedDataParallel::DistributedDataParallel(const std::vector<std::pair<std::string, torch::Tensor>>& parameters,
                                                 const std::vector<std::pair<std::string, torch::Tensor>>& buffers,
                                                 ProcessGroup& pg, DdpOptions options)
    : pg_(pg), options_(std::move(options)) {
  setup(parameters, buffers);
}

void DistributedDataParallel::setup(const std::vector<std::pair<std::string, torch::Tensor>>& parameters,
                                    const std::vector<std::pair<std::string, torch::Tensor>>& buffers) {
  // A tensor under two names (tied weights) is one parameter: reduced once, its gradient the sum of
  // both uses (autograd accumulates them into the one .grad before its hook runs).
  for (const auto& [name, p] : detail::distinct(parameters)) {
    if (!p.requires_grad()) continue;  // frozen: never reduced, on every rank alike
    names_.push_back(name);
    params_.push_back(p);
  }
  for (const auto& b : buffers) buffers_.push_back(b.second);
  if (options_.timeline_path.empty()) {
    if (const char* env = std::getenv("MPIDDP_TIMELINE")) options_.timeline_path = env;
  }
  timeline_ = std::make_unique<Timeline>(options_.timeline_path, pg_.rank());
  MPIDDP_CHECK(!(options_.reduction && options_.compression),
               "DdpOptions::compression goes with the default reduction; a reduction given in DdpOptions::reduction "
               "takes its wire dtype itself");
  reduction_ = options_.reduction ? options_.reduction : all_reduce(options_.compression);
  MPIDDP_CHECK(options_.mean_tail_values >= 0 && options_.mean_tail_values <= (int64_t{1} << 20),
               "DdpOptions::mean_tail_values must be in [0, 2^20], got " + std::to_string(options_.mean_tail_values));

  verify_same_model();
  check_deferred(parameters);
  {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> all = params_;
    for (const auto& item : parameters) {
      if (!item.second.requires_grad()) all.push_back(item.second);
    }
    all.insert(all.end(), buffers_.begin(), buffers_.end());
    // Deferred parameters (units.hpp) have no values yet: ZeRO stage 3 broadcasts each unit's as it
    // initialises it.
    all.erase(std::remove_if(all.begin(), all.end(), [](const torch::Tensor& t) { return is_deferred(t); }), all.end());
    broadcast_tensors(all);
  }
  make_buckets();
  add_mean_tail(parameters);
  make_gradient_views();
  add_gradient_hooks();
}

// Deferred parameters (units.hpp) only where the reduction shards them: trainable, in a bucket group.
void DistributedDataParallel::check_deferred(
    const std::vector<std::pair<std::string, torch::Tensor>>& parameters) const {
  const auto group_of = group_of_parameters();
  std::set<const void*> sharded;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (reduction_->shards_group_parameters() && !group_of.empty() && group_of[i] >= 0) {
      sharded.insert(params_[i].unsafeGetTensorImpl());
    }
  }
  for (const auto& [name, p] : parameters) {
    MPIDDP_CHECK(!is_deferred(p) || sharded.count(p.unsafeGetTensorImpl()),
                 "the parameter '" + name +
                     "' is deferred (no memory yet): only ZeRO stage 3 initialises deferred "
                     "parameters, a unit's trainable ones; materialise the model first (materialise_units(module), "
                     "Model::materialise())");
  }
}

void DistributedDataParallel::make_buckets() {
  std::vector<int64_t> numels;
  std::vector<c10::ScalarType> dtypes;
  int64_t gradient_bytes = 0;
  for (const auto& p : params_) {
    numels.push_back(p.numel());
    dtypes.push_back(p.scalar_type());
    gradient_bytes += p.numel() * static_cast<int64_t>(p.element_size());
  }
  const int64_t cap =
      options_.bucket_cap_bytes == kAutoBucketCap ? reduction_->bucket_cap(gradient_bytes) : options_.bucket_cap_bytes;
  layouts_ = assign_buckets(numels, dtypes, cap, options_.first_bucket_cap_bytes, group_of_parameters());
  std::vector<torch::TensorOptions> options;
  for (auto& l : layouts_) {
    l.padded = reduction_->padded(l.numel, pg_.size());
    options.push_back(params_[l.params[0]].options());
  }
  reduction_->attach(layouts_, options, pg_);
  where_.resize(params_.size());
  for (size_t b = 0; b < layouts_.size(); ++b) {
    auto bucket = std::make_unique<Bucket>();
    bucket->layout = layouts_[b];
    bucket->reduction = reduction_.get();
    bucket->index = b;
    bucket->keeps_buffer = reduction_->keeps_buffer();
    bucket->options = options[b];
    if (bucket->keeps_buffer) bucket->flat = torch::zeros({layouts_[b].padded}, options[b]);
    bucket->ready.assign(layouts_[b].params.size(), false);
    bucket->pending = layouts_[b].params.size();
    for (size_t s = 0; s < layouts_[b].params.size(); ++s) where_[layouts_[b].params[s]] = {b, s};
    buckets_.push_back(std::move(bucket));
  }
}

std::vector<int> DistributedDataParallel::group_of_parameters() const {
  if (options_.bucket_groups.empty()) return {};
  std::map<const void*, size_t> index;
  for (size_t i = 0; i < params_.size(); ++i) index[params_[i].unsafeGetTensorImpl()] = i;
  std::vector<int> group_of(params_.size(), -1);
  for (size_t g = 0; g < options_.bucket_groups.size(); ++g) {
    for (const auto& p : options_.bucket_groups[g]) {
      const auto it = index.find(p.unsafeGetTensorImpl());
      if (it == index.end()) continue;  // frozen: not reduced
      MPIDDP_CHECK(group_of[it->second] < 0 || group_of[it->second] == static_cast<int>(g),
                   "parameter '" + names_[it->second] + "' is in two bucket groups (" +
                       std::to_string(group_of[it->second]) + " and " + std::to_string(g) + ")");
      group_of[it->second] = static_cast<int>(g);
    }
  }
  return group_of;
}

void DistributedDataParallel::add_mean_tail(const std::vector<std::pair<std::string, torch::Tensor>>& parameters) {
  if (options_.mean_tail_values == 0) return;
  // The tail follows the gradients of the bucket launched last when the reduction averages whole
  // buffers; with no trainable parameter, or buffers that do not outlive the step, it is an
  // all-reduced bucket of its own (no slots: launched after the others), on the model's device.
  if (buckets_.empty() || !buckets_.back()->keeps_buffer) {
    c10::Device device(c10::kCPU);
    if (!parameters.empty())
      device = parameters.front().second.device();
    else if (!buffers_.empty())
      device = buffers_.front().device();
    auto bucket = std::make_unique<Bucket>();
    bucket->options = torch::TensorOptions().dtype(torch::kFloat).device(device);
    tail_reduction_ = all_reduce();
    tail_reduction_->attach({bucket->layout}, {bucket->options}, pg_);
    bucket->reduction = tail_reduction_.get();
    bucket->flat = torch::zeros({0}, bucket->options);
    buckets_.push_back(std::move(bucket));
  }
  auto& flat = buckets_.back()->flat;
  flat = torch::cat({flat, torch::zeros({options_.mean_tail_values}, flat.options())});
  mean_tail_ = flat.narrow(0, buckets_.back()->layout.padded, options_.mean_tail_values);
}

void DistributedDataParallel::make_gradient_views() {
  // Each parameter's gradient, as an alias of its place in its bucket: after the first step .grad is
  // this view, so the averaged bucket is the gradient (no copy back) and the optimizer reads it
  // in place (PyTorch DDP's gradient_as_bucket_view). Not for transient buffers.
  views_.resize(params_.size());
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto [b, s] = where_[i];
    if (!buckets_[b]->keeps_buffer) continue;
    // set_() onto the bucket's storage, not narrow().view(): autograd would record a view, and
    // libtorch 1.13's Optimizer::zero_grad() refuses to detach_() one.
    // No strides given: contiguous.
    const auto& flat = buckets_[b]->flat;
    views_[i] = torch::empty({0}, flat.options())
                    .set_(flat.storage(), flat.storage_offset() + layouts_[b].offsets[s], params_[i].sizes());
  }
}

void DistributedDataParallel::add_gradient_hooks() {
  // A post-hook on each parameter's AccumulateGrad node (as PyTorch's reducer): it runs once the
  // gradient is in .grad, which after the first step is the bucket itself. The accumulators are
  // held here: autograd keeps only a weak reference, and a new one would come without the hook.
  for (size_t i = 0; i < params_.size(); ++i) {
    auto accumulator = torch::autograd::impl::grad_accumulator(params_[i]);
    MPIDDP_CHECK(accumulator, "parameter '" + names_[i] + "' has no gradient accumulator (not a leaf?)");
    const auto key = accumulator->add_post_hook(std::make_unique<GradientReady>(this, i));
    hooks_.emplace_back(std::move(accumulator), key);
  }
}

DistributedDataParallel::~DistributedDataParallel() {
  if (auto pass = pass_.lock()) pass->ddp = nullptr;  // a callback that outlives us must not call back
  for (auto& [accumulator, key] : hooks_) accumulator->del_post_hook(key);
}

void DistributedDataParallel::verify_same_model() {
  // Every rank sends its whole parameter list (names, dtypes, shapes) to every rank as int32
  // characters; all ranks then compare against rank 0 and reach the same verdict.
  std::string sig;
  for (size_t i = 0; i < params_.size(); ++i) sig += describe_param(names_[i], params_[i]) + "\n";
  auto len = torch::tensor({static_cast<int64_t>(sig.size())}, torch::kLong);
  auto lens = torch::zeros({pg_.size()}, torch::kLong);
  const c10::Device dev = params_.empty() ? c10::Device(c10::kCPU) : params_[0].device();
  {
    auto l = len.to(dev), ls = lens.to(dev);
    pg_.allgather(l, ls);
    lens = ls.cpu();
  }
  const int64_t longest = std::max<int64_t>(1, lens.max().item<int64_t>());
  std::vector<int32_t> codes(static_cast<size_t>(longest), 0);
  std::copy(sig.begin(), sig.end(), codes.begin());
  auto chars = torch::from_blob(codes.data(), {longest}, torch::kInt).to(dev);
  auto all = torch::zeros({pg_.size() * longest}, torch::TensorOptions().dtype(torch::kInt).device(dev));
  pg_.allgather(chars, all);
  all = all.cpu();
  auto acc = all.accessor<int32_t, 1>();
  std::vector<std::vector<std::string>> lists;
  for (int r = 0; r < pg_.size(); ++r) {
    std::string s;
    const auto n = lens[r].item<int64_t>();
    for (int64_t i = 0; i < n; ++i) s += static_cast<char>(acc[r * longest + i]);
    lists.push_back(split_lines(s));
  }
  for (int r = 1; r < pg_.size(); ++r) {
    const auto& a = lists[0];
    const auto& b = lists[static_cast<size_t>(r)];
    for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
      if (i < a.size() && i < b.size() && a[i] == b[i]) continue;
      std::string msg = "model mismatch across ranks: parameter " + std::to_string(i) + " is ";
      msg += i < b.size() ? "'" + b[i] + "'" : "missing";
      msg += " on rank " + std::to_string(r) + " but ";
      msg += i < a.size() ? "'" + a[i] + "'" : "missing";
      msg += " on rank 0 (" + std::to_string(b.size()) + " vs " + std::to_string(a.size()) + " trainable parameters)";
      MPIDDP_THROW_AGREED(msg);  // every rank compared the same lists: the same verdict everywhere
    }
  }
}

void DistributedDataParallel::broadcast_tensors(const std::vector<torch::Tensor>& tensors) {
  // Rank 0's values, few broadcasts and little memory: tensors of one dtype packed into chunks of
  // less than kBroadcastChunkBytes each (a copy, then one broadcast), a tensor of that size or more
  // sent alone (as it is where contiguous). The model exists once plus one chunk or one tensor, not
  // twice (ZeRO stage 3's start-up peak: at 4 ranks the model whole is its steady state too).
  std::map<c10::ScalarType, std::vector<torch::Tensor>> by_dtype;
  for (const auto& t : tensors) {
    if (t.numel() > 0) by_dtype[t.scalar_type()].push_back(t.detach());
  }
  for (auto& [dtype, group] : by_dtype) {
    std::vector<torch::Tensor> chunk;
    int64_t chunk_bytes = 0;
    const auto send_chunk = [&] {
      if (chunk.empty()) return;
      std::vector<torch::Tensor> flat;
      for (const auto& t : chunk) flat.push_back(t.reshape(-1));
      auto buffer = torch::cat(flat);
      pg_.broadcast(buffer, 0);
      int64_t offset = 0;
      for (auto& t : chunk) {
        t.copy_(buffer.narrow(0, offset, t.numel()).view_as(t));
        offset += t.numel();
      }
      chunk.clear();
      chunk_bytes = 0;
    };
    for (auto& t : group) {
      const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
      if (bytes >= kBroadcastChunkBytes) {  // by size alone: every rank chunks alike, whatever its strides
        auto whole = t.is_contiguous() ? t.view(-1) : t.contiguous().view(-1);
        pg_.broadcast(whole, 0);
        if (!t.is_contiguous()) t.copy_(whole.view(t.sizes()));
        continue;
      }
      if (chunk_bytes + bytes > kBroadcastChunkBytes) send_chunk();
      chunk.push_back(t);
      chunk_bytes += bytes;
    }
    send_chunk();
  }
}

void DistributedDataParallel::prepare_forward() {
  if (!options_.broadcast_buffers || buffers_.empty() || pg_.size() == 1) return;
  ScopedSpan span(timeline_.get(), "broadcast buffers", "comm");
  torch::NoGradGuard no_grad;
  broadcast_tensors(buffers_);
}

DistributedDataParallel::Pass::~Pass() {
  if (!reduced && ddp != nullptr) ddp->abandon_pass();
}

void DistributedDataParallel::on_gradient(size_t param) {
  if (!sync_) return;  // no_sync: AccumulateGrad summed into .grad (the bucket after a first step)
  auto pass = pass_.lock();
  if (!pass || pass->reduced) {
    // The first gradient of a backward pass that reduces: the reduction is queued on the autograd
    // engine, which runs it once the whole graph is done, before loss.backward() returns
    // (PyTorch's reducer does the same). The Pass lives inside that callback: if backward throws,
    // autograd drops the callback unrun, and the Pass's destructor settles what was launched.
    rethrow_abandoned_error();
    pass = std::make_shared<Pass>();
    pass->ddp = this;
    pass_ = pass;
    torch::autograd::Engine::get_default_engine().queue_callback([this, pass] {
      pass->reduced = true;  // also when finish_reduction throws: the error travels with backward's
      finish_reduction();
    });
  }
  auto [b, slot] = where_[param];
  Bucket& bucket = *buckets_[b];
  MPIDDP_CHECK(!bucket.ready[slot], "parameter '" + names_[param] + "' received a gradient twice in one backward pass");
  // AccumulateGrad has run. When .grad is the bucket's view it added in place and there is nothing
  // to do; otherwise (the first step, .grad cleared to undefined, or a tensor set by the user)
  // .grad is copied into the bucket and becomes the view.
  adopt_gradient(param);
  bucket.ready[slot] = true;
  if (--bucket.pending == 0) launch_ready_buckets(false);
  poll_launched();
}

void DistributedDataParallel::abandon_pass() noexcept {
  // A backward pass threw after some gradients arrived, and autograd is unwinding. What it
  // launched is finished here, before the caller can touch the gradients (every rank that threw
  // at the same point launched the same buckets in the same order); the buckets then hold partial
  // sums, which the next step is expected to zero. An error while waiting is kept for the next
  // call into DDP: a destructor must not throw.
  try {
    for (size_t k = 0; k < next_to_launch_; ++k) {
      if (buckets_[k]->work) buckets_[k]->work->wait();
    }
  } catch (...) {
    abandoned_error_ = std::current_exception();
  }
  try {
    reset_buckets();
  } catch (...) {
    if (!abandoned_error_) abandoned_error_ = std::current_exception();
  }
  ++stats_.aborted_passes;
}

void DistributedDataParallel::rethrow_abandoned_error() {
  if (auto e = std::exchange(abandoned_error_, nullptr)) std::rethrow_exception(e);
}

void DistributedDataParallel::reset_buckets() {
  for (auto& b : buckets_) {
    std::fill(b->ready.begin(), b->ready.end(), false);
    b->pending = b->ready.size();
    b->work.reset();
    b->completed = {};
    b->reduction->release(b->index);
    if (!b->keeps_buffer) b->flat = torch::Tensor();  // only what the reduction keeps outlives it
  }
  next_to_launch_ = 0;
}

torch::Tensor& DistributedDataParallel::buffer(Bucket& b) {
  if (!b.flat.defined()) b.flat = torch::zeros({b.layout.padded}, b.options);
  return b.flat;
}

torch::Tensor DistributedDataParallel::owned_gradient(size_t b) const {
  MPIDDP_CHECK(b < layouts_.size(), "owned_gradient: no bucket " + std::to_string(b));
  return reduction_->owned_gradient(b, buckets_[b]->flat);
}

void DistributedDataParallel::adopt_gradient(size_t param) {
  auto& g = params_[param].mutable_grad();
  const auto [b, s] = where_[param];
  if (!buckets_[b]->keeps_buffer) {
    // A transient buffer: the gradient (or zeros) goes into it, and .grad is released.
    torch::NoGradGuard no_grad;
    auto& flat = buffer(*buckets_[b]);
    if (g.defined()) flat.narrow(0, layouts_[b].offsets[s], g.numel()).view(g.sizes()).copy_(g);
    g = torch::Tensor();
    return;
  }
  if (g.is_same(views_[param])) return;
  torch::NoGradGuard no_grad;
  if (g.defined()) {
    views_[param].copy_(g);
  } else {
    views_[param].zero_();
  }
  g = views_[param];
}

void DistributedDataParallel::zero_grad() {
  rethrow_abandoned_error();
  torch::NoGradGuard no_grad;
  for (auto& b : buckets_) {
    if (b->flat.defined()) b->flat.zero_();
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& g = params_[i].mutable_grad();
    if (g.defined()) g = views_[i];  // transient buffers: undefined, which releases what no_sync accumulated
  }
}

void DistributedDataParallel::poll_launched() {
  // Drives progress of the launched all-reduces while backward computes (MPI's non-blocking
  // collectives advance only inside MPI calls) and notes when each finished, for the timeline.
  for (size_t k = 0; k < next_to_launch_; ++k) {
    Bucket& b = *buckets_[k];
    if (b.completed == Timeline::Clock::time_point{} && b.work && b.work->test()) {
      b.completed = Timeline::Clock::now();
      sent(b);
    }
  }
}

void DistributedDataParallel::launch(Bucket& b) {
  b.launched = Timeline::Clock::now();
  b.work = b.reduction->launch(b.index, buffer(b));  // a transient buffer is made here when no gradient came
}

void DistributedDataParallel::launch_ready_buckets(bool at_end) {
  // Index order on every rank: bucket k is launched only after buckets 0..k-1.
  while (next_to_launch_ < buckets_.size()) {
    Bucket& b = *buckets_[next_to_launch_];
    if (b.pending != 0) {
      if (!at_end) return;
      // Parameters without a gradient this step: what they accumulated under no_sync, or zeros.
      for (size_t s = 0; s < b.ready.size(); ++s) {
        if (b.ready[s]) continue;
        adopt_gradient(b.layout.params[s]);
        b.ready[s] = true;
      }
      b.pending = 0;
      ++stats_.buckets_launched_at_end;
    } else if (!at_end) {
      ++stats_.buckets_launched_early;
    } else {
      ++stats_.buckets_launched_at_end;
    }
    launch(b);
    ++next_to_launch_;
    if (!b.keeps_buffer) bound_transient_buffers();
  }
}

void DistributedDataParallel::bound_transient_buffers() {
  // At most kTransientBuffersInFlight launched buckets keep their transient buffers; an older one is
  // waited for and dropped, so the whole gradient never exists at once (MPI's non-blocking
  // collectives move only when polled, and late buckets see few gradient hooks to poll them).
  size_t live = 0;
  for (size_t k = next_to_launch_; k-- > 0;) {
    Bucket& b = *buckets_[k];
    if (b.keeps_buffer || !b.flat.defined() || ++live <= kTransientBuffersInFlight) continue;
    b.work->wait_on_device();
    if (b.completed == Timeline::Clock::time_point{}) b.completed = Timeline::Clock::now();
    sent(b);
  }
}

void DistributedDataParallel::sent(Bucket& b) {
  b.reduction->sent(b.index);
  if (b.keeps_buffer) return;
  // The collective's handle holds its tensors too: it goes with the buffer (a finished one has
  // nothing left to wait for).
  b.flat = torch::Tensor();
  b.work.reset();
}

void DistributedDataParallel::backward(const torch::Tensor& loss) {
  const int64_t before = stats_.steps;
  {
    ScopedSpan span(timeline_.get(), "backward");
    if (loss.dim() == 0 && loss.requires_grad()) {
      // The seed gradient (1) is kept between steps rather than made by ones_like in every
      // backward. The engine only reads it: the cache's reference keeps AccumulateGrad from
      // adopting it as a leaf's .grad. Other shapes take loss.backward() and its own error.
      if (!seed_.defined() || seed_.scalar_type() != loss.scalar_type() || seed_.device() != loss.device()) {
        seed_ = torch::ones({}, loss.options().requires_grad(false));
      }
      torch::autograd::backward({loss}, {seed_});
    } else {
      loss.backward();
    }
  }
  steps_seen_ = before;
  finish_backward();
}

void DistributedDataParallel::finish_backward() {
  if (!sync_) return;
  rethrow_abandoned_error();
  // A pass whose gradients reached no parameter queued no reduction; this rank still has to take
  // part in the one the other ranks make (zeros, launched in bucket order).
  if (stats_.steps == steps_seen_) finish_reduction();
  steps_seen_ = stats_.steps;
}

void DistributedDataParallel::finish_reduction() {
  torch::NoGradGuard no_grad;
  try {
    launch_ready_buckets(true);
    for (size_t k = 0; k < buckets_.size(); ++k) {
      Bucket& b = *buckets_[k];
      // None once a transient buffer was dropped with it. On a GPU the host does not wait: the
      // optimizer's kernels queue behind the collective (nccl).
      if (b.work) b.work->wait_on_device();
      if (b.completed == Timeline::Clock::time_point{}) b.completed = Timeline::Clock::now();
      if (timeline_->enabled()) {
        timeline_->span(b.reduction->name() + " bucket " + std::to_string(k), "comm", b.launched, b.completed);
      }
      // Each .grad is its view of the bucket (or the reduction keeps this rank's slice): it now
      // holds the average.
      b.reduction->finish(b.index, b.flat);
    }
  } catch (...) {
    reset_buckets();  // a failed or timed-out collective: the error goes out of backward, DDP stays usable
    throw;
  }
  reset_buckets();
  ++stats_.steps;
  // Buffers (BatchNorm running statistics) follow rank 0 after every reducing pass, so no rank
  // needs a call before its forward (as PyTorch DDP's broadcast before forward: in training mode
  // the forward uses batch statistics, and in evaluation mode every rank holds rank 0's).
  if (options_.broadcast_buffers && !buffers_.empty() && pg_.size() > 1) {
    ScopedSpan span(timeline_.get(), "broadcast buffers", "comm");
    broadcast_tensors(buffers_);
  }
}

}  // namespace mpiddp
