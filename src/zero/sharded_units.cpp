#include "zero/sharded_units.hpp"

#include "zero/slice.hpp"

#include <mpiddp/allocator.hpp>
#include <mpiddp/error.hpp>

#include <torch/csrc/autograd/engine.h>

#include <algorithm>
#include <exception>
#include <limits>
#include <string>

namespace mpiddp::detail {

namespace {

void free_bytes(const torch::Tensor& t) { t.storage().unsafeGetStorageImpl()->reset(); }

size_t bytes_of(const torch::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

}  // namespace

// On the CPU a gathered bucket's bytes come from a spare buffer of its size where one is kept,
// else from the allocator; spare buffers are kept up to twice the largest unit's bytes (by bytes,
// so that small units' buffers, as the GPT's head's, do not crowd out a block's), so gathering a
// model of equal blocks never churns the heap. On a GPU the caching allocator does this.
void ShardedUnits::give_bytes(const torch::Tensor& t) {
  auto* storage = t.storage().unsafeGetStorageImpl();
  const size_t bytes = bytes_of(t);
  const auto spare = spare_.find(bytes);
  if (spare != spare_.end() && !spare->second.empty()) {
    storage->set_data_ptr_noswap(std::move(spare->second.back()));
    spare->second.pop_back();
    spare_bytes_ -= bytes;
  } else {
    storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  }
  storage->set_nbytes(bytes);
}

// The bytes back among the spare buffers (or freed); the storage left without any (its tensors too).
void ShardedUnits::take_bytes(const torch::Tensor& t) {
  if (!t.device().is_cpu() || spare_bytes_ + bytes_of(t) > max_spare_bytes_) return free_bytes(t);
  auto* storage = t.storage().unsafeGetStorageImpl();
  spare_[bytes_of(t)].push_back(storage->set_data_ptr(c10::DataPtr(nullptr, t.device())));
  storage->set_nbytes(0);
  spare_bytes_ += bytes_of(t);
}

struct ShardedUnits::Pass {
  ShardedUnits* units = nullptr;
  bool done = false;  ///< the pass's end ran (else it is dropped unrun: backward threw)
  ~Pass() {
    if (!units || done) return;
    try {
      units->release_all();
    } catch (...) {  // a destructor must not throw: a failed all-gather shows again at the next collective
    }
  }
};

ShardedUnits::ShardedUnits(DistributedDataParallel& ddp, const ZeroOptions& options)
    : pg_(ddp.process_group()),
      options_(options),
      buckets_(ddp.buckets().size()),
      buckets_of_unit_(ddp.bucket_group_count()),
      self_(std::make_shared<ShardedUnits*>(this)) {
  for (size_t b = 0; b < ddp.buckets().size(); ++b) {
    const int unit = ddp.buckets()[b].group;  // the sharding gave DDP its units as the bucket groups
    if (unit >= 0) buckets_of_unit_[static_cast<size_t>(unit)].push_back(b);  // none: no trainable parameters
  }
  for (size_t u = 0; u < buckets_of_unit_.size(); ++u) set_of_unit_.push_back({u});
  // Unit by unit, bucket by bucket, so that the memory the parameters were built in goes back while
  // the next bucket is sharded: the peak is the model as it came plus one bucket's slice, never a
  // second copy of the units; a deferred model (units.hpp) gets one unit's memory at a time, so it
  // is never whole. A failure part-way (memory) leaves the buckets sharded so far NaN, as the
  // destructor does: their other ranks' values are gone from this rank.
  try {
    for (size_t u = 0; u < buckets_of_unit_.size(); ++u) {
      initialise(u, ddp);
      for (size_t b : buckets_of_unit_[u]) shard(b, ddp.buckets()[b], ddp.parameters());
      release_free_memory();  // the unit as it was built (or initialised): freed for good, not kept by malloc
    }
  } catch (...) {
    try {
      make_whole(false);
    } catch (...) {  // out of memory even for NaN: the sharded parameters stay without bytes
    }
    throw;
  }
  for (const auto& buckets : buckets_of_unit_) {
    size_t bytes = 0;
    for (size_t b : buckets) bytes += bytes_of(buckets_[b].full);
    max_spare_bytes_ = std::max(max_spare_bytes_, 2 * bytes);
  }
}

// Zeros, then (given init_unit) the unit's initial values, rank 0's: the same on every rank, as
// DDP's broadcast makes the parameters it is given.
void ShardedUnits::initialise(size_t unit, const DistributedDataParallel& ddp) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> deferred;
  for (size_t b : buckets_of_unit_[unit]) {
    for (size_t i : ddp.buckets()[b].params) {
      auto p = ddp.parameters()[i];
      if (!is_deferred(p)) continue;
      p.set_data(torch::zeros(p.sizes(), p.options()));
      deferred.push_back(p);
    }
  }
  if (deferred.empty() || !options_.init_unit) return;
  options_.init_unit(unit);
  for (const auto& p : deferred) pg_.broadcast(p, 0);
}

void ShardedUnits::shard(size_t b, const BucketLayout& layout, const std::vector<torch::Tensor>& params) {
  torch::NoGradGuard no_grad;
  const int ranks = pg_.size();
  const auto options = params[layout.params.front()].options();
  auto shard = torch::zeros({slice_numel(layout, ranks)}, options);  // the padding stays 0
  const int64_t first = slice_begin(layout, pg_.rank(), ranks);
  for_each_in_slice(layout, params, pg_.rank(), ranks, [&](size_t i, int64_t in_param, int64_t in_bucket, int64_t n) {
    shard.narrow(0, in_bucket - first, n).copy_(params[i].detach().reshape(-1).narrow(0, in_param, n));
  });
  // The parameters become views of the bucket's whole buffer, whose bytes exist only while gathered.
  // (Views made while the buffer has its bytes: narrow() checks them.)
  auto& bucket = buckets_[b];
  bucket.full = torch::empty({layout.padded}, options);
  std::vector<torch::Tensor> views;
  for (size_t s = 0; s < layout.params.size(); ++s) {
    const auto& p = params[layout.params[s]];
    views.push_back(bucket.full.narrow(0, layout.offsets[s], p.numel()).view(p.sizes()));
  }
  for (size_t i : layout.params) bucket.params.push_back(params[i]);
  bucket.offsets = layout.offsets;
  // From here nothing throws: the bucket counts as sharded (make_whole's) once its parameters move.
  free_bytes(bucket.full);
  bucket.shard = std::move(shard);
  for (size_t s = 0; s < bucket.params.size(); ++s) bucket.params[s].set_data(views[s]);
}

ShardedUnits::~ShardedUnits() {
  if (auto pass = pass_.lock()) pass->units = nullptr;
  bool gather = std::uncaught_exceptions() == 0;
  try {
    release_all();
  } catch (...) {
    gather = false;
  }
  spare_.clear();  // before the whole copies are made
  spare_bytes_ = 0;
  if (!options_.whole_at_end) return;  // left without memory, as asked
  try {
    make_whole(gather);
  } catch (...) {
    try {
      make_whole(false);
    } catch (...) {  // out of memory even for NaN: the parameters stay without bytes
    }
  }
}

void ShardedUnits::make_whole(bool gather) {
  torch::NoGradGuard no_grad;
  for (auto& bucket : buckets_) {
    if (!bucket.shard.defined()) continue;
    auto whole = torch::empty({bucket.shard.numel() * pg_.size()}, bucket.shard.options());
    if (gather) {
      pg_.allgather(bucket.shard, whole);
    } else {
      whole.fill_(std::numeric_limits<double>::quiet_NaN());
    }
    for (size_t s = 0; s < bucket.params.size(); ++s) {
      auto& p = bucket.params[s];
      p.set_data(whole.narrow(0, bucket.offsets[s], p.numel()).view(p.sizes()));
    }
    bucket.shard = torch::Tensor();
  }
}

void ShardedUnits::start(size_t unit) {
  for (size_t u : set_of_unit_[unit]) {
    for (size_t b : buckets_of_unit_[u]) {
      auto& bucket = buckets_[b];
      if (bucket.live) continue;
      give_bytes(bucket.full);
      bucket.live = true;
      bucket.gathering = pg_.allgather_async(bucket.shard, bucket.full);
    }
  }
}

void ShardedUnits::gather(size_t unit) {
  start(unit);
  for (size_t u : set_of_unit_[unit]) {
    for (size_t b : buckets_of_unit_[u]) {
      auto& work = buckets_[b].gathering;
      if (!work) continue;
      work->wait_on_device();  // the unit's forward or backward kernels queue behind it
      work.reset();
    }
  }
}

bool ShardedUnits::in_set(size_t unit, size_t of) const {
  const auto& set = set_of_unit_[of];
  return std::find(set.begin(), set.end(), unit) != set.end();
}

void ShardedUnits::release(size_t unit) {
  for (size_t b : buckets_of_unit_[unit]) {
    auto& bucket = buckets_[b];
    if (!bucket.live) continue;
    if (bucket.gathering) {
      bucket.gathering->wait_on_device();
      bucket.gathering.reset();
    }
    take_bytes(bucket.full);
    bucket.live = false;
  }
}

void ShardedUnits::release_all() {
  for (size_t u = 0; u < buckets_of_unit_.size(); ++u) release(u);
}

torch::Tensor ShardedUnits::run(size_t unit, const UnitForward& forward, const torch::Tensor& input,
                                const std::vector<size_t>& borrowed) {
  const size_t units = buckets_of_unit_.size();
  auto outside = [&](size_t u) {
    return "ZeRO stage 3: the model runs unit " + std::to_string(u) + " but names " + std::to_string(units) +
           " units (UnitModule::units())";
  };
  MPIDDP_CHECK(unit < units, outside(unit));
  auto& set = set_of_unit_[unit];
  set.assign(1, unit);
  for (size_t u : borrowed) {
    MPIDDP_CHECK(u < units, outside(u));
    if (u != unit) set.push_back(u);
  }
  gather(unit);
  const bool prefetching = options_.prefetch && unit + 1 < units;
  if (prefetching) start(unit + 1);
  auto output = forward(input);
  // The last unit's backward comes next: its set stays gathered for it (all-gathers fewer per step).
  const bool backward_next = unit + 1 == units && torch::GradMode::is_enabled();
  if (options_.reshard_after_forward && !backward_next) {
    for (size_t u : set) {
      if (!(prefetching && in_set(u, unit + 1))) release(u);
    }
  }
  if (torch::GradMode::is_enabled() && output.requires_grad()) {
    std::weak_ptr<ShardedUnits*> self = self_;
    output.register_hook([self, unit](const torch::Tensor& grad) {
      if (auto units = self.lock()) (*units)->before_backward(unit);
      return grad;
    });
  }
  return output;
}

void ShardedUnits::before_backward(size_t unit) {
  auto current = pass_.lock();
  if (!current || current->done) {  // the first unit of a backward pass: everything is freed when it ends
    auto pass = std::make_shared<Pass>();
    pass->units = this;
    pass_ = pass;
    torch::autograd::Engine::get_default_engine().queue_callback([pass] {
      pass->done = true;
      if (pass->units) pass->units->release_all();
    });
  }
  // Backward runs the units in reverse: those after `unit` are done (their gradients are in), and
  // so are the units they borrowed unless `unit` or the next one needs them; units before `unit`
  // kept from forward (reshard_after_forward false) stay until their backward.
  const bool prefetching = options_.prefetch && unit > 0;
  for (size_t u = 0; u < buckets_of_unit_.size(); ++u) {
    const bool needed = in_set(u, unit) || (prefetching && in_set(u, unit - 1));
    if (!needed && (u > unit || options_.reshard_after_forward)) release(u);
  }
  gather(unit);
  if (prefetching) start(unit - 1);
}

}  // namespace mpiddp::detail
