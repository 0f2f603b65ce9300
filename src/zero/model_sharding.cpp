// How a training run holds its model's parameters (model_sharding.hpp).
#include "zero/model_sharding.hpp"

#include <mpiddp/error.hpp>
#include <mpiddp/units.hpp>

#include <algorithm>

namespace mpiddp::detail {

namespace {
int64_t trainable_bytes(const std::vector<torch::Tensor>& unit) {
  int64_t bytes = 0;
  for (const auto& p : unit) bytes += p.requires_grad() ? p.numel() * static_cast<int64_t>(p.element_size()) : 0;
  return bytes;
}
}  // namespace

bool shards_units(int zero_stage) { return zero_stage == kMaxZeroStage; }

ModelSharding::ModelSharding(Model& model, int zero_stage, ZeroOptions options)
    : model_(model), shards_units_(detail::shards_units(zero_stage)), options_(std::move(options)) {
  MPIDDP_CHECK(!shards_units_ || !model_.units().empty(),
               "ZeRO stage 3 shards the model unit by unit, and the model (" + model_.description() +
                   ") has none (the built-in models and C++ UnitModules have units; a TorchScript module or .pt2 "
                   "program has not): train it at --zero-stage 2");
}

void ModelSharding::adopt(DataCheck check) {
  if (!shards_units_) model_.materialise();
  check_ = std::move(check);
  start_run();
  if (!deferred_at_start_ && check_) check_(/*collective=*/false);
}

void ModelSharding::start_run() { deferred_at_start_ = has_deferred_parameters(model_); }

void ModelSharding::check_once_sharded() const {
  if (deferred_at_start_ && check_) check_(/*collective=*/true);
}

std::unique_ptr<ModelSharding> ModelSharding::for_planning() const {
  std::unique_ptr<ModelSharding> planning(new ModelSharding(*this));
  planning->options_.whole_at_end = !deferred_at_start_;  // the units left as the run started with them
  return planning;
}

void ModelSharding::configure(DdpOptions& ddp) const { ddp.bucket_groups = bucket_groups(); }

std::vector<std::vector<torch::Tensor>> ModelSharding::bucket_groups() const {
  return shards_units_ ? model_.units() : std::vector<std::vector<torch::Tensor>>{};
}

ZeroOptions ModelSharding::zero_options(bool initialise) const {
  ZeroOptions zero = options_;
  if (initialise && shards_units_) zero.init_unit = [&model = model_](size_t unit) { model.init_unit(unit); };
  return zero;
}

void ModelSharding::attach(const ZeroOptimizer* zero) {
  if (zero) model_.set_unit_hooks(zero->unit_hooks());
}

void ModelSharding::detach() { model_.set_unit_hooks(nullptr); }

UnitsPlan ModelSharding::units_plan() const {
  UnitsPlan plan;
  if (shards_units_) {
    for (const auto& unit : model_.units()) plan.unit_bytes.push_back(trainable_bytes(unit));
  }
  plan.prefetch = options_.prefetch;
  plan.reshard_after_forward = options_.reshard_after_forward;
  return plan;
}

int64_t ModelSharding::lockstep_forwards(int64_t mine, int64_t most) const {
  return shards_units_ ? std::max<int64_t>(0, most - mine) : 0;
}

}  // namespace mpiddp::detail
