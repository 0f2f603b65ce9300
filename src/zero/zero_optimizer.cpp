#include <mpiddp/compat.hpp>
#include <mpiddp/error.hpp>
#include <mpiddp/optim.hpp>
#include <mpiddp/zero.hpp>

#include <algorithm>
#include <functional>
#include <map>

#include "zero/sharded_units.hpp"
#include "zero/slice.hpp"

namespace mpiddp {

namespace {

constexpr const char* kUnshardable =
    "ZeRO shards SGD, Adam and AdamW (and mpiddp's FusedAdam, FusedAdamW); this optimizer is none of them";

// The optimizer table's row of `opt`; mpiddp::Error for one ZeRO cannot shard.
const OptimizerSpec& shardable(const torch::optim::Optimizer& opt) {
  const auto* spec = optimizer_spec_of(opt);
  MPIDDP_CHECK(spec, kUnshardable);
  return *spec;
}

}  // namespace

ZeroOptimizer::ZeroOptimizer(DistributedDataParallel& ddp, torch::optim::Optimizer& optimizer, ZeroOptions options)
    : ddp_(ddp), pg_(ddp.process_group()), outer_(optimizer) {
  MPIDDP_CHECK(stage() >= 1,
               "ZeroOptimizer needs a DistributedDataParallel that reduces with zero_reduction(1, 2 or 3) "
               "(DdpOptions::reduction)");
  shardable(optimizer);
  const auto& params = ddp.parameters();
  std::map<const void*, size_t> index;
  for (size_t i = 0; i < params.size(); ++i) index[params[i].unsafeGetTensorImpl()] = i;
  std::vector<int64_t> group_of(params.size(), -1);  // -1: a parameter the optimizer does not step
  const auto& groups = outer_.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const auto& p : groups[g].params()) {
      const auto it = index.find(p.unsafeGetTensorImpl());
      MPIDDP_CHECK(it != index.end(),
                   "ZeroOptimizer: the optimizer holds a tensor that DDP does not reduce "
                   "(frozen, or not a parameter of the model)");
      group_of[it->second] = static_cast<int64_t>(g);
    }
  }

  // This rank's slice of each bucket, cut into pieces: one per parameter it touches, a view of
  // that parameter's own elements (at stage 3, of the unit's shard) whose .grad is the same
  // elements of the averaged gradient.
  torch::NoGradGuard no_grad;
  const auto& buckets = ddp.buckets();
  for (const auto& p : params) {
    MPIDDP_CHECK(p.is_contiguous(), "ZeRO needs contiguous parameters (a view of each is stepped in place)");
  }
  if (stage() == 3) units_ = std::make_unique<detail::ShardedUnits>(ddp, options);
  for (size_t b = 0; b < buckets.size(); ++b) {
    for_each_in_slice(b, [&](size_t i, int64_t in_param, int64_t in_bucket, int64_t numel) {
      pieces_.push_back({i, b, in_param, in_bucket, numel});
    });
  }
  // (After stage 3's sharding: the gradient shards' pages are first touched here, below.)
  for (const auto& piece : pieces_) {
    const int64_t in_slice = piece.in_bucket - slice_begin(piece.bucket);
    auto shard = units_ && units_->sharded(piece.bucket)
                     ? units_->shard(piece.bucket).narrow(0, in_slice, piece.numel)
                     : params[piece.param].detach().view(-1).narrow(0, piece.in_param, piece.numel);
    shard.mutable_grad() = ddp.owned_gradient(piece.bucket).narrow(0, in_slice, piece.numel);
    shards_.push_back(shard);
  }

  std::vector<torch::optim::OptimizerParamGroup> inner_groups;
  for (size_t g = 0; g < groups.size(); ++g) {  // a parameter the optimizer does not step: in no group
    std::vector<torch::Tensor> mine;
    for (size_t k = 0; k < pieces_.size(); ++k) {
      if (group_of[pieces_[k].param] == static_cast<int64_t>(g)) mine.push_back(shards_[k]);
    }
    if (mine.empty()) continue;
    inner_groups.emplace_back(std::move(mine), groups[g].options().clone());
    outer_group_.push_back(g);
  }
  if (!inner_groups.empty()) inner_ = shardable(outer_).same_kind_over(outer_, std::move(inner_groups));
  take_state();
}

ZeroOptimizer::~ZeroOptimizer() = default;

UnitHooks* ZeroOptimizer::unit_hooks() const { return units_.get(); }

bool ZeroOptimizer::holds_whole(size_t i) const {
  if (!units_) return true;
  const auto* piece = piece_of(i);
  if (piece) return !units_->sharded(piece->bucket);
  for (size_t b = 0; b < ddp_.buckets().size(); ++b) {  // no elements here: is its bucket a unit's?
    const auto& in = ddp_.buckets()[b].params;
    if (std::find(in.begin(), in.end(), i) != in.end()) return !units_->sharded(b);
  }
  return true;
}

torch::Tensor ZeroOptimizer::owned_values(size_t i) const {
  const auto* piece = piece_of(i);
  if (!piece) return torch::empty({0}, ddp_.parameters()[i].options().requires_grad(false));
  return shards_[static_cast<size_t>(piece - pieces_.data())];
}

int64_t ZeroOptimizer::slice_begin(size_t bucket) const {
  return detail::slice_begin(ddp_.buckets()[bucket], pg_.rank(), pg_.size());
}

int64_t ZeroOptimizer::owned_numel() const {
  int64_t n = 0;
  for (const auto& piece : pieces_) n += piece.numel;
  return n;
}

void ZeroOptimizer::take_state() {
  // A resumed run's state is whole in the given optimizer: each piece keeps its slice of it.
  const auto& spec = shardable(outer_);
  const auto& params = ddp_.parameters();
  for (size_t k = 0; k < pieces_.size() && inner_; ++k) {
    const auto* whole = state_of(outer_, params[pieces_[k].param]);
    if (!whole) continue;
    auto fields = spec.fields_of(*whole);
    for (auto& [name, t] : fields.tensors) t = t.reshape(-1).narrow(0, pieces_[k].in_param, pieces_[k].numel).clone();
    auto& state = inner_->state();
    state[compat::optimizer_state_key(state, shards_[k].unsafeGetTensorImpl())] = spec.state_from(fields);
  }
  outer_.state().clear();
}

torch::Tensor ZeroOptimizer::clip_grad_norm(double max_norm) {
  // The shards' squared norms summed over the ranks: the global norm DDP's whole gradients give.
  const auto& params = ddp_.parameters();
  const auto device = params.empty() ? c10::Device(c10::kCPU) : params.front().device();
  auto squares = grad_squared_norm(shards_).to(device).reshape({1});  // on the group's device
  pg_.allreduce_async(squares, squares, ReduceOp::kSum)->wait_on_device();
  return clip_grads_to(shards_, squares.reshape({}), max_norm);  // the host does not wait for it
}

void ZeroOptimizer::step() {
  torch::NoGradGuard no_grad;
  if (inner_) {
    auto& inner_groups = inner_->param_groups();
    for (size_t g = 0; g < inner_groups.size(); ++g) {
      inner_groups[g].set_options(outer_.param_groups()[outer_group_[g]].options().clone());
    }
    inner_->step();
  }
  if (units_) units_->release_all();  // stage 3: gathered units are stale; each is gathered when next run
  // Each bucket's parameters, every rank's slice from its owner: a buffer of the bucket's layout,
  // this rank's slice filled from its parameters, all-gathered in place, copied out. One bucket
  // at a time, so that the buffer costs one bucket, not the model.
  const auto& params = ddp_.parameters();
  for (size_t b = 0; b < ddp_.buckets().size(); ++b) {
    if (units_ && units_->sharded(b)) continue;
    const auto& layout = ddp_.buckets()[b];
    auto flat = torch::empty({layout.padded}, params[layout.params.front()].options());
    flat.narrow(0, layout.numel, layout.padded - layout.numel).zero_();
    const detail::Share mine = detail::slice_of(layout, pg_.rank(), pg_.size());
    const int64_t lo = mine.first, hi = mine.end();
    for_each_in_slice(b, [&](size_t i, int64_t in_param, int64_t in_bucket, int64_t numel) {
      flat.narrow(0, in_bucket, numel).copy_(params[i].detach().view(-1).narrow(0, in_param, numel));
    });
    pg_.allgather_async(flat.narrow(0, lo, hi - lo), flat)->wait_on_device();  // copied out on the device
    for (size_t s = 0; s < layout.params.size(); ++s) {                        // the elements other ranks own
      const auto& p = params[layout.params[s]];
      const int64_t begin = layout.offsets[s], end = begin + p.numel();
      auto mine = p.detach().view(-1);
      if (begin < lo)
        mine.narrow(0, 0, std::min(end, lo) - begin).copy_(flat.narrow(0, begin, std::min(end, lo) - begin));
      if (end > hi) {
        const int64_t from = std::max(begin, hi);
        mine.narrow(0, from - begin, end - from).copy_(flat.narrow(0, from, end - from));
      }
    }
  }
}

void ZeroOptimizer::for_each_in_slice(size_t bucket,
                                      const std::function<void(size_t, int64_t, int64_t, int64_t)>& visit) const {
  detail::for_each_in_slice(ddp_.buckets()[bucket], ddp_.parameters(), pg_.rank(), pg_.size(), visit);
}

torch::Tensor ZeroOptimizer::known_state() const {
  const auto& spec = shardable(outer_);
  const auto& params = ddp_.parameters();
  const auto& names = spec.state_fields;
  const auto device = params.empty() ? c10::Device(c10::kCPU) : params.front().device();
  auto known = torch::zeros({static_cast<int64_t>(params.size()), static_cast<int64_t>(names.size()) + 1},
                            torch::TensorOptions().dtype(torch::kLong));
  {
    auto mine = known.accessor<int64_t, 2>();
    for (size_t k = 0; k < pieces_.size() && inner_; ++k) {
      const auto* st = state_of(*inner_, shards_[k]);
      if (!st) continue;
      const auto fields = spec.fields_of(*st);
      const auto i = static_cast<int64_t>(pieces_[k].param);
      mine[i][0] = fields.step + 1;
      for (size_t f = 0; f < names.size(); ++f) {
        const auto it = fields.tensors.find(names[f]);
        if (it != fields.tensors.end())
          mine[i][static_cast<int64_t>(f) + 1] = 1 + static_cast<int64_t>(it->second.scalar_type());
      }
    }
  }
  known = known.to(device);
  pg_.allreduce(known, ReduceOp::kMax);
  return known.cpu();
}

const ZeroOptimizer::Piece* ZeroOptimizer::piece_of(size_t param) const {
  for (const auto& piece : pieces_) {
    if (piece.param == param) return &piece;  // a parameter lies in one bucket: one piece at most
  }
  return nullptr;
}

std::pair<int64_t, int64_t> ZeroOptimizer::owned_range(size_t i) const {
  const auto* piece = piece_of(i);
  return piece ? std::make_pair(piece->in_param, piece->numel) : std::make_pair(int64_t{0}, int64_t{0});
}

std::vector<ZeroOptimizer::StateLayout> ZeroOptimizer::state_layout() const {
  const auto& names = shardable(outer_).state_fields;
  const auto known = known_state();
  const auto has = known.accessor<int64_t, 2>();
  std::vector<StateLayout> layout(ddp_.parameters().size());
  for (size_t i = 0; i < layout.size(); ++i) {
    const auto row = static_cast<int64_t>(i);
    layout[i].present = has[row][0] > 0;
    layout[i].step = has[row][0] - 1;
    for (size_t f = 0; f < names.size(); ++f) {
      const int64_t code = has[row][static_cast<int64_t>(f) + 1];
      if (code > 0) layout[i].fields[names[f]] = static_cast<c10::ScalarType>(code - 1);
    }
  }
  return layout;
}

std::optional<ParamStateFields> ZeroOptimizer::owned_state(size_t i) const {
  const auto* piece = piece_of(i);
  if (!piece || !inner_) return std::nullopt;
  const auto* st = state_of(*inner_, shards_[static_cast<size_t>(piece - pieces_.data())]);
  if (!st) return std::nullopt;
  return shardable(outer_).fields_of(*st);
}

void ZeroOptimizer::set_owned_state(size_t i, const ParamStateFields& fields) {
  const auto* piece = piece_of(i);
  MPIDDP_CHECK(piece && inner_, "ZeroOptimizer: this rank holds no elements of parameter " + std::to_string(i));
  auto& state = inner_->state();
  const auto& shard = shards_[static_cast<size_t>(piece - pieces_.data())];
  state[compat::optimizer_state_key(state, shard.unsafeGetTensorImpl())] = shardable(outer_).state_from(fields);
}

void ZeroOptimizer::gather_state(int root) {
  torch::NoGradGuard no_grad;
  const auto& spec = shardable(outer_);
  const auto& params = ddp_.parameters();
  const auto& names = spec.state_fields;
  std::vector<std::map<std::string, torch::Tensor>> piece_fields(pieces_.size());
  for (size_t k = 0; k < pieces_.size() && inner_; ++k) {
    if (const auto* st = state_of(*inner_, shards_[k])) piece_fields[k] = spec.fields_of(*st).tensors;
  }
  const auto known = known_state();
  const auto has = known.accessor<int64_t, 2>();

  std::vector<ParamStateFields> whole(params.size());
  for (size_t f = 0; f < names.size(); ++f) {
    for (size_t b = 0; b < ddp_.buckets().size(); ++b) {
      const auto& layout = ddp_.buckets()[b];
      bool any = false;
      for (size_t i : layout.params) any = any || has[static_cast<int64_t>(i)][static_cast<int64_t>(f) + 1];
      if (!any) continue;  // the same verdict on every rank
      auto slice = torch::zeros({detail::slice_numel(layout, pg_.size())}, params[layout.params.front()].options());
      for (size_t k = 0; k < pieces_.size(); ++k) {
        const auto it = piece_fields[k].find(names[f]);
        if (pieces_[k].bucket != b || it == piece_fields[k].end()) continue;
        slice.narrow(0, pieces_[k].in_bucket - slice_begin(b), pieces_[k].numel).copy_(it->second.reshape(-1));
      }
      auto full = torch::empty({layout.padded}, slice.options());
      pg_.allgather(slice, full);
      if (root >= 0 && pg_.rank() != root) continue;
      for (size_t s = 0; s < layout.params.size(); ++s) {
        const size_t i = layout.params[s];
        if (!has[static_cast<int64_t>(i)][static_cast<int64_t>(f) + 1]) continue;
        whole[i].tensors[names[f]] =
            full.narrow(0, layout.offsets[s], params[i].numel()).view(params[i].sizes()).clone();
      }
    }
  }
  if (root >= 0 && pg_.rank() != root) return;
  auto& state = outer_.state();
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t step = has[static_cast<int64_t>(i)][0];
    if (step == 0) continue;
    whole[i].step = step - 1;
    state[compat::optimizer_state_key(state, params[i].unsafeGetTensorImpl())] = spec.state_from(whole[i]);
  }
}

void ZeroOptimizer::drop_gathered_state() { outer_.state().clear(); }

}  // namespace mpiddp
