// ZeRO (DeepSpeed's names), all of it: the gradient reductions that shard DDP's buckets and the
// optimizer that steps only this rank's shard, and stage 3's sharded parameters.
//
// Each bucket's buffer is padded to a multiple of the world size N and rank r owns its r-th equal
// slice (Megatron's distributed optimizer shards per bucket the same way). ZeroOptimizer keeps
// optimizer state only for the owned slices (views of the parameters' own elements); after its step
// every bucket's parameters are all-gathered through a buffer of one bucket. Stage 1: DDP
// all-reduces as usual (zero_reduction(1)) and the owned slices are read out of the averaged
// buckets. Stage 2: DDP reduce-scatters each bucket during backward (zero_reduction(2)) and keeps
// only the owned slice of the gradient. Stage 3: as stage 2, and each unit's buckets (DdpOptions::bucket_groups,
// Model::units(); units.hpp) keeps only this rank's slice of its parameters too: the unit's
// parameters are all-gathered just before its forward and its backward and freed after them
// (src/zero/sharded_units.hpp), so a rank holds 1/N of the units' parameters, gradients and
// optimizer state plus the units gathered at the moment. Parameters outside every unit stay whole
// (stage 2). The model's forward must run its units through the hooks: model.set_unit_hooks(
// zero.unit_hooks()) (the Trainer does), and nothing may read a unit's parameters outside it.
// Every forward is then collective (each unit all-gathered): all ranks run the same forwards (a
// forward on one rank alone, say in an on_epoch callback, waits for the others until the timeout).
//
// Use from a plain loop, as the DDP wrapper (the Trainer does the same for `--zero-stage`):
//   DdpOptions o;
//   o.reduction = zero_reduction(2);
//   DistributedDataParallel ddp(model, pg, o);
//   auto adamw = std::make_shared<mpiddp::FusedAdamW>(model->parameters(), options);
//   ZeroOptimizer zero(ddp, *adamw);   // adamw keeps the hyperparameters, zero the state
//   loss.backward();                   // reduced inside backward, as with DDP
//   zero.clip_grad_norm(1.0);          // optional: the global norm
//   zero.step();                       // the owned slices stepped, parameters all-gathered
//   ddp.zero_grad();
//
// The parameters must be contiguous and stay where they are (do not move the model to another
// device after making it: the views would go stale). Hyperparameters are read from the given
// optimizer's groups at every step (a learning-rate schedule sets them there). Its state is sliced
// once when it is made, and gathered back into it by gather_state(); a snapshot instead writes and
// reads each rank's slices in place (owned_range, owned_state, set_owned_state).
//
// Cross-rank contract: every rank makes it, steps it, clips and gathers with it at the same
// points, after the same reducing backward; each of those calls is collective.
#pragma once

#include <mpiddp/ddp.hpp>
#include <mpiddp/optim.hpp>
#include <mpiddp/reduction.hpp>

#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mpiddp {

/// The highest ZeRO stage mpiddp implements.
constexpr int kMaxZeroStage = 3;
/// The one rule for a ZeRO stage's range; the message names the field as `name`.
void check_zero_stage(int stage, const std::string& name);
/// The gradient reduction of ZeRO stage `stage` (0: DDP's all_reduce), `wire` as all_reduce()'s.
std::shared_ptr<GradientReduction> zero_reduction(int stage, std::optional<c10::ScalarType> wire = std::nullopt);

struct ZeroOptions {
  /// Stage 3: a unit's parameters are freed after its forward and gathered again for its backward
  /// (FSDP's reshard_after_forward); false keeps them from forward to backward (more memory, one
  /// all-gather less per unit).
  bool reshard_after_forward = true;
  /// Stage 3: the next unit's all-gather is in flight while the current unit computes, in forward
  /// and in backward (gathered at once: a unit's set, the unit and those it borrows, and the next
  /// one's).
  bool prefetch = true;
  /// Stage 3: when the ZeroOptimizer ends, the units' parameters are all-gathered whole again, so
  /// that a caller reads the trained model (Trainer::fit() returns it so). false leaves them without
  /// memory instead (reading one then is undefined): the whole model never exists on a rank; the
  /// `mpiddp` executable, which reads nothing after training, does so.
  bool whole_at_end = true;
  /// Stage 3, deferred initialisation (units.hpp): units whose parameters came without memory get it
  /// one unit at a time, in order; init_unit(u) writes unit u's initial values (Model::init_unit),
  /// rank 0's are broadcast, each rank keeps its slice and frees the rest. Unset: they start as
  /// zeros (a resume, which reads each rank's slices next).
  std::function<void(size_t unit)> init_unit;
};

class UnitHooks;
namespace detail {
class ShardedUnits;
}

class ZeroOptimizer {
 public:
  /// Shards `optimizer`'s state: SGD, Adam and AdamW (and mpiddp's FusedAdam/FusedAdamW, still
  /// fused), else mpiddp::Error; `ddp` must reduce with zero_reduction(1 or 2). Every tensor it optimizes must be one
  /// `ddp` reduces. Collective only through what `ddp` is (no communication below stage 3). At stage 3 the parameters
  /// of `ddp`'s unit buckets are sharded here (their memory freed), and deferred ones initialised and broadcast from
  /// rank 0 first (ZeroOptions::init_unit): collective.
  ZeroOptimizer(DistributedDataParallel& ddp, torch::optim::Optimizer& optimizer, ZeroOptions options = {});
  ~ZeroOptimizer();
  ZeroOptimizer(const ZeroOptimizer&) = delete;
  ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

  int stage() const { return ddp_.reduction().zero_stage(); }
  /// This rank's slices of the parameters, each a view of a parameter's elements whose .grad is
  /// the same elements of the averaged gradient (for unscaling and checks: GradScaler::unscale).
  const std::vector<torch::Tensor>& shards() const { return shards_; }
  /// Parameter elements whose optimizer state this rank holds.
  int64_t owned_numel() const;

  /// Scales the gradient so that its global L2 norm (the shards' squared norms summed over the
  /// ranks) is at most `max_norm`, by clip_grad_norm_'s rule; returns the norm before (a float64
  /// 0-dim tensor on the gradients' device: reading it waits for them). Collective.
  torch::Tensor clip_grad_norm(double max_norm);
  /// The optimizer's step on this rank's shards with the given optimizer's current
  /// hyperparameters, then every bucket's parameters all-gathered. Collective.
  void step();

  /// Stage 3: what the model's units run through (Model::set_unit_hooks); nullptr below stage 3.
  UnitHooks* unit_hooks() const;
  /// Whether parameter `i` is whole on this rank (false: stage 3, a unit's parameter; only its
  /// owned_range() lives here, in owned_values()).
  bool holds_whole(size_t i) const;
  /// The values of this rank's elements of parameter `i` (owned_range()), 1-D; writing them sets
  /// the parameter (a sharded one: from its next gather on). Local.
  torch::Tensor owned_values(size_t i) const;

  /// The parameters it shards: DDP's, in DDP's order (the index the calls below take).
  const std::vector<torch::Tensor>& parameters() const { return ddp_.parameters(); }
  /// This rank's elements of parameter `i`: [first, first + numel) of its flattened elements
  /// (numel 0: it holds none of its state).
  std::pair<int64_t, int64_t> owned_range(size_t i) const;
  /// What every parameter's state holds, the same on every rank (the owners tell the others):
  /// whether it has any yet, its step, and the dtype of each of its fields (absent: no such field).
  struct StateLayout {
    bool present = false;
    int64_t step = 0;
    std::map<std::string, c10::ScalarType> fields;
  };
  std::vector<StateLayout> state_layout() const;  ///< collective (one small all-reduce)
  /// The state of this rank's elements of parameter `i` (each field just those elements, 1-D),
  /// or nullopt. Local.
  std::optional<ParamStateFields> owned_state(size_t i) const;
  /// Sets it: a resumed snapshot's slice. Local.
  void set_owned_state(size_t i, const ParamStateFields& fields);

  /// Every parameter's optimizer state, whole, into the given optimizer on rank `root` (empty
  /// elsewhere; root -1: on every rank), as an unsharded run would hold it: for a snapshot, or to
  /// hand the state back when done. Collective.
  void gather_state(int root = 0);
  /// Drops what gather_state() put into the given optimizer.
  void drop_gathered_state();

 private:
  struct Piece {       ///< one parameter's elements inside this rank's slice of a bucket
    size_t param = 0;  ///< index into ddp.parameters()
    size_t bucket = 0;
    int64_t in_param = 0;   ///< first element, within the flattened parameter
    int64_t in_bucket = 0;  ///< first element, within the bucket's buffer
    int64_t numel = 0;
  };
  void take_state();
  /// known[i][0]: parameter i's step + 1 (0: no state yet); known[i][1 + f]: 1 + the dtype of its
  /// field f (0: none), the same on every rank. Collective.
  torch::Tensor known_state() const;
  const Piece* piece_of(size_t param) const;
  int64_t slice_begin(size_t bucket) const;
  /// visit(parameter, first element in it, first element in the bucket, count) for every
  /// parameter with elements in this rank's slice of `bucket`, in bucket order.
  void for_each_in_slice(size_t bucket, const std::function<void(size_t, int64_t, int64_t, int64_t)>& visit) const;

  DistributedDataParallel& ddp_;
  ProcessGroup& pg_;
  torch::optim::Optimizer& outer_;
  std::unique_ptr<detail::ShardedUnits> units_;  ///< stage 3's parameters; null below
  std::vector<Piece> pieces_;
  std::vector<torch::Tensor> shards_;               ///< per piece: its parameter elements, .grad set
  std::unique_ptr<torch::optim::Optimizer> inner_;  ///< over shards_; null when this rank owns none
  std::vector<size_t> outer_group_;                 ///< per group of inner_: the given optimizer's group
};

}  // namespace mpiddp
