// The memory plan of a training run (memory_plan.hpp): its inputs read from the run, the probe,
// the rule, the text.
#include "train/memory_plan.hpp"

#include <mpiddp/compat.hpp>
#include <mpiddp/memory.hpp>
#include <mpiddp/optim.hpp>
#include <mpiddp/units.hpp>
#include <mpiddp/zero.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>
#include <sstream>

#include "common/distinct.hpp"
#include "common/even_share.hpp"
#include "snapshot/parallel_snapshot.hpp"
#include "snapshot/snapshot_policy.hpp"

namespace mpiddp {

namespace {
std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.0f", static_cast<double>(bytes) / (1 << 20));
  return text;
}
}  // namespace

std::string MemoryPlan::describe() const {
  std::ostringstream out;
  out << "memory plan per rank: peak " << mib(peak()) << " MiB = process " << mib(process) << " + parameters "
      << mib(parameters) << " + gradients " << mib(gradients) << " + optimizer state " << mib(optimizer_state)
      << " + activations " << mib(activations) << " + snapshot buffers " << mib(snapshot_buffers);
  return out.str();
}

std::string MemoryPlan::against(const std::vector<int64_t>& rank_peaks, int64_t steps) const {
  const auto top = std::max_element(rank_peaks.begin(), rank_peaks.end());
  const auto least = std::min_element(rank_peaks.begin(), rank_peaks.end());
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%.2f",
                static_cast<double>(*top) / static_cast<double>(std::max<int64_t>(1, peak())));
  std::ostringstream out;
  out << "memory: measured peak " << mib(*top) << " MiB per rank (rank " << top - rank_peaks.begin();
  if (rank_peaks.size() > 1) out << "; the least " << mib(*least) << ", rank " << least - rank_peaks.begin();
  out << ") after " << steps << (steps == 1 ? " step" : " steps") << ", " << ratio << " x the plan's " << mib(peak())
      << " MiB";
  return out.str();
}

namespace detail {

CpuGeneratorGuard::CpuGeneratorGuard() {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  state_ = generator.get_state();
}

CpuGeneratorGuard::~CpuGeneratorGuard() {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state_);
}

OptimizerStateGuard::OptimizerStateGuard(torch::optim::Optimizer& optimizer) : optimizer_(optimizer) {
  for (const auto& [key, state] : optimizer_.state()) saved_[key] = state->clone();
}

OptimizerStateGuard::~OptimizerStateGuard() { optimizer_.state() = std::move(saved_); }

namespace {

// Stage 3's units, largest first (none below stage 3).
std::vector<int64_t> sharded_units(const PlanInputs& in) {
  std::vector<int64_t> units = in.units;
  std::sort(units.rbegin(), units.rend());
  return units;
}

// Stage 3: the parameters and buffers a rank holds between units (its slices of the units', the rest whole).
int64_t sharded_model_bytes(const PlanInputs& in) {
  const auto units = sharded_units(in);
  const int64_t unit_bytes = std::accumulate(units.begin(), units.end(), int64_t{0});
  return in.model_bytes - unit_bytes + largest_share(unit_bytes, in.world);
}

// Stage 3 keeps the units gathered at the moment whole: the two largest with prefetch, one
// without, all when kept from forward to backward.
int64_t gathered_unit_bytes(const PlanInputs& in) {
  const auto units = sharded_units(in);
  const size_t gathered = std::min(units.size(), !in.reshard_after_forward ? units.size() : in.prefetch ? 2 : 1);
  return std::accumulate(units.begin(), units.begin() + static_cast<std::ptrdiff_t>(gathered), int64_t{0});
}

int64_t tensor_bytes(const torch::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// Drops a parameter's gradient as soon as autograd has accumulated it (the memory plan's probe).
struct DropGradient : torch::autograd::FunctionPostHook {
  explicit DropGradient(torch::Tensor p) : param(std::move(p)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    param.mutable_grad().reset();
    return outputs;
  }
  torch::Tensor param;
};

// What one micro-batch's forward and backward add to the process at their peak, besides the
// parameters' gradients (`gradient_bytes`): the activations and backward's working memory (a
// checkpointed block's recompute included), by running them once. 0 off the CPU.
int64_t probe_activations(const PlannedRun& run, int64_t gradient_bytes, DistributedDataParallel& ddp) {
  const auto& o = run.options;
  if (!o.device.is_cpu()) return 0;  // the CUDA caching allocator's figures: not yet
  // What the step moves, put back after: the CPU generator (dropout), the buffers (BatchNorm),
  // the gradients (none yet: each parameter's .grad left undefined, as training starts).
  const CpuGeneratorGuard rng;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> buffers;
  for (const auto& [name, t] : run.model.named_buffers()) buffers.emplace_back(t, t.clone());
  const auto batch = run.train.read_range(0, std::min<int64_t>(o.batch_size, run.train.size()));
  const auto params = trainable_parameters(run.model);
  // At stages 2-3 a gradient is whole only while its bucket is reduced: here each is dropped as it
  // arrives, so that the probe holds one at a time, not the model's (at stage 3, the whole model and
  // its gradients: 8 B/param).
  const bool drop_gradients = o.zero_stage >= 2;
  struct Hooks {
    std::vector<std::pair<compat::GradAccumulatorPtr, uintptr_t>> added;
    ~Hooks() {
      for (auto& [accumulator, key] : added) accumulator->del_post_hook(key);
    }
  } droppers;
  if (drop_gradients) {
    for (const auto& p : params) {
      auto accumulator = torch::autograd::impl::grad_accumulator(p);
      if (!accumulator) continue;
      const auto key = accumulator->add_post_hook(std::make_unique<DropGradient>(p));
      droppers.added.emplace_back(std::move(accumulator), key);
    }
  }
  // The peak of a forward and backward over what the process holds now: the high-water mark is
  // reset to the current resident size first (Linux's clear_refs 5), then read after backward.
  // Where it cannot be reset, what the forward holds for backward (malloc's bytes in use).
  const int64_t resident = resident_bytes();
  const bool peak_reset = reset_peak_resident_bytes();
  const int64_t heap = heap_bytes_in_use();
  int64_t held = 0;
  {
    const auto local = ddp.no_sync();  // the units gathered where sharded, nothing reduced
    auto loss = run.loss(batch);
    held = heap_bytes_in_use() - heap;
    loss.backward();
  }
  // The step's peak less the parameters' gradients (the plan counts those by ZeRO's rule).
  const int64_t kept_gradients = drop_gradients ? 0 : gradient_bytes;
  const int64_t step_peak = peak_reset ? peak_resident_bytes() - resident - kept_gradients : held;
  {
    torch::NoGradGuard no_grad;
    for (auto& p : params) p.mutable_grad().reset();
    for (auto& [t, saved] : buffers) t.copy_(saved);
  }
  return std::max<int64_t>({0, held, step_peak});
}

}  // namespace

MemoryPlan plan_from(const PlanInputs& in) {
  MemoryPlan plan;
  // Stage 3 keeps 1/N of its units' parameters and the units gathered at the moment.
  plan.parameters = sharded_model_bytes(in) + gathered_unit_bytes(in);
  plan.process = std::max<int64_t>(0, in.resident - (in.model_resident >= 0 ? in.model_resident : in.model_bytes));
  const int64_t shard = largest_share(in.trainable_bytes, in.world);
  plan.gradients = in.trainable_bytes;
  if (in.zero_stage >= 2) {
    // The owned slice of each averaged bucket; whole, at worst the largest buckets: one being
    // filled and those being reduce-scattered (DDP bounds them), these with what the backend holds
    // while reducing them.
    const size_t whole = kTransientBuffersInFlight + 1;
    std::vector<int64_t> buckets = in.buckets;
    std::sort(buckets.rbegin(), buckets.rend());
    plan.gradients = shard;
    for (size_t k = 0; k < std::min(buckets.size(), whole); ++k) {
      plan.gradients += buckets[k];
      const bool reducing = k < kTransientBuffersInFlight;
      if (reducing && in.reduce_scatter_scratch) plan.gradients += in.reduce_scatter_scratch(buckets[k]);
    }
  }
  plan.optimizer_state = in.state_fields * (in.zero_stage >= 1 ? shard : in.trainable_bytes);
  plan.activations = in.activations;
  if (in.snapshots) {
    // Rank 0 holds each part the others send, one tensor at a time; MPI-IO's collective buffer
    // is 16 MiB (ROMIO's and OMPIO's cb_buffer_size).
    plan.snapshot_buffers = in.snapshot_through_rank_zero ? in.largest_tensor : kParallelIoFromBytes;
  }
  return plan;
}

// Each gradient bucket's bytes as DDP assigns them (its own rule, assign_buckets): the trainable
// parameters in its order, bucketed by the cap in force, the sharding's groups apart.
std::vector<int64_t> gradient_buckets(const PlannedRun& run, int64_t trainable_bytes) {
  const auto& o = run.options;
  const auto params = trainable_parameters(run.model);
  std::map<const void*, int> group;
  const auto groups = run.sharding.bucket_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const auto& p : groups[g]) group.emplace(p.unsafeGetTensorImpl(), static_cast<int>(g));
  }
  std::vector<int64_t> numels;
  std::vector<c10::ScalarType> dtypes;
  std::vector<int> group_of;
  for (const auto& p : params) {
    numels.push_back(p.numel());
    dtypes.push_back(p.scalar_type());
    const auto it = group.find(p.unsafeGetTensorImpl());
    group_of.push_back(it == group.end() ? -1 : it->second);
  }
  const auto reduction = zero_reduction(o.zero_stage);
  const int64_t cap =
      o.ddp.bucket_cap_bytes != kAutoBucketCap ? o.ddp.bucket_cap_bytes : reduction->bucket_cap(trainable_bytes);
  std::vector<int64_t> out;
  for (const auto& b : assign_buckets(numels, dtypes, cap, o.ddp.first_bucket_cap_bytes, group_of)) {
    out.push_back(reduction->padded(b.numel, run.pg.size()) * static_cast<int64_t>(c10::elementSize(b.dtype)));
  }
  return out;
}

namespace {
// The model's parameters and buffers, each tensor once.
std::vector<std::pair<std::string, torch::Tensor>> model_tensors(const Model& model) {
  auto tensors = model.named_parameters();
  for (const auto& b : model.named_buffers()) tensors.push_back(b);
  return detail::distinct(tensors);
}
}  // namespace

ResidentBeforeRun resident_before_run(const Model& model) {
  ResidentBeforeRun before;
  before.process = resident_bytes();
  for (const auto& [name, t] : model_tensors(model)) before.model += is_deferred(t) ? 0 : tensor_bytes(t);
  return before;
}

MemoryPlan plan_run(const PlannedRun& run, DistributedDataParallel& ddp, const ResidentBeforeRun& before) {
  const auto& o = run.options;
  detail::PlanInputs in;
  in.resident = before.process;
  in.model_resident = before.model;
  for (const auto& [name, t] : model_tensors(run.model)) {
    in.model_bytes += tensor_bytes(t);
    in.largest_tensor = std::max(in.largest_tensor, tensor_bytes(t));
  }
  for (const auto& p : trainable_parameters(run.model)) in.trainable_bytes += tensor_bytes(p);
  in.world = run.pg.size();
  in.zero_stage = o.zero_stage;
  const UnitsPlan units = run.sharding.units_plan();
  in.units = units.unit_bytes;
  in.prefetch = units.prefetch;
  in.reshard_after_forward = units.reshard_after_forward;
  in.buckets = gradient_buckets(run, in.trainable_bytes);
  in.reduce_scatter_scratch = [&pg = run.pg](int64_t bytes) { return pg.reduce_scatter_scratch_bytes(bytes); };
  // The optimizer table's count; 2 for an optimizer it does not know (Adam's, the common case).
  const OptimizerSpec* spec = optimizer_spec_of(run.optimizer);
  in.state_fields = spec ? spec->state_tensors(run.optimizer) : 2;
  in.snapshots = detail::SnapshotPolicy(o).enabled();
  const int64_t snapshot_bytes = in.model_bytes + in.state_fields * in.trainable_bytes;
  in.snapshot_through_rank_zero =
      detail::resolve_io(detail::SnapshotIo::kAuto, snapshot_bytes) == detail::SnapshotIo::kThroughRankZero;
  // Sharded: the probe's gathering reuses the buffers the data check's forward left (they are in the
  // resident size it starts from), so its peak is the activations'.
  in.activations = probe_activations(run, in.trainable_bytes, ddp);
  return plan_from(in);
}

}  // namespace detail
}  // namespace mpiddp
