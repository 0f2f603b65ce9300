// How a training run holds its model's parameters across the ranks, as one wrapper applied to the
// model (FSDP2's fully_shard): ZeRO stage 3 shards the model's units (units.hpp), every other
// stage holds the model whole. The one owner of what sharding the parameters asks of a run; the
// Trainer makes one for its model and asks it, never the stage:
//   adopt()          a deferred model (units.hpp) stays deferred where the units are sharded (they
//                    are initialised one by one as they are sharded), and is made whole elsewhere;
//                    the model is checked against the data once it has values: at once where whole,
//                    by check_once_sharded() where its units wait for their sharding
//   configure()      DDP's bucket groups: the units, no bucket holding two units' parameters
//   zero_options()   ZeRO's: the units initialised when sharded (a fresh start) or left for a resume
//   attach/detach    the model's units run through the ZeroOptimizer's gathers while it lives
//   units_plan()     the memory plan's view of the parameters: the units' bytes, what is gathered
//   lockstep_forwards()  a sharded forward is collective: the forwards a rank adds so that every
//                    rank runs as many as the one with the most (evaluation)
//   start_run()      a run's start: the model deferred now or not, which decides check_once_sharded(),
//                    slices_from_snapshot() and for_planning()
//   for_planning()   the same sharding for a plan made apart from a run: the units left as they were
//   slices_from_snapshot()  a resume reads a deferred model's units as slices (restore_shards)
//
// Cross-rank contract: every rank makes it alike (the same stage and model) and attaches and
// detaches it at the same points.
#pragma once

#include <mpiddp/ddp.hpp>
#include <mpiddp/model.hpp>
#include <mpiddp/zero.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace mpiddp::detail {

/// What the memory plan counts of the model's sharding (train/memory_plan.hpp).
struct UnitsPlan {
  std::vector<int64_t> unit_bytes;    ///< each sharded unit's trainable bytes; none where the model is whole
  bool prefetch = true;               ///< ZeroOptions::prefetch
  bool reshard_after_forward = true;  ///< ZeroOptions::reshard_after_forward
};

class ModelSharding {
 public:
  /// `model` held as ZeRO stage `zero_stage` holds it, with stage 3's `options`.
  ModelSharding(Model& model, int zero_stage, ZeroOptions options);
  ModelSharding& operator=(const ModelSharding&) = delete;

  /// Whether the model's units are sharded (stage 3).
  bool shards_units() const { return shards_units_; }
  /// The model against the data (a forward on a sample); `collective` where the model is sharded,
  /// its failure then agreed by every rank.
  using DataCheck = std::function<void(bool collective)>;
  /// The model as the Trainer takes it: whole unless its units are sharded (materialised now), and
  /// `check`ed at once where it has values; a deferred one waits for check_once_sharded().
  void adopt(DataCheck check);
  /// A run (or a plan) starts: whether the model is deferred now (adopted so, or left so by a run
  /// with ZeroOptions::whole_at_end false) decides the rest of its start.
  void start_run();
  /// The check adopt() left, where the run started with the model deferred, once ZeRO has given its
  /// units values (collective); nothing where the model had values.
  void check_once_sharded() const;
  /// This sharding for a plan made apart from a run: at its end the units are left as the run
  /// started with them (a deferred model's deferred again, a whole one gathered whole).
  std::unique_ptr<ModelSharding> for_planning() const;
  /// Whether a resume reads the model's units as this rank's slices (the run started with them
  /// deferred: the snapshot's reader left them), not whole.
  bool slices_from_snapshot() const { return deferred_at_start_; }
  /// DDP's options for this model: its bucket groups.
  void configure(DdpOptions& ddp) const;
  /// The groups of parameters whose buckets hold no other group's: the units where they are sharded
  /// (each sharded and gathered by its own buckets), else none.
  std::vector<std::vector<torch::Tensor>> bucket_groups() const;
  /// ZeRO's options: `initialise` has deferred units given their initial values as they are
  /// sharded; else they start as zeros (a resume reads their slices next).
  ZeroOptions zero_options(bool initialise) const;
  /// The model's units run through `zero`'s gathers from now on (nothing below stage 3, or null).
  void attach(const ZeroOptimizer* zero);
  /// They run plainly again (before the ZeroOptimizer goes).
  void detach();
  /// The memory plan's view of the sharding: the units' bytes, prefetch, resharding.
  UnitsPlan units_plan() const;
  /// Forwards a rank with `mine` batches adds so that it runs `most`, the most any rank runs (a
  /// sharded forward is collective); 0 where the model is whole.
  int64_t lockstep_forwards(int64_t mine, int64_t most) const;

 private:
  ModelSharding(const ModelSharding&) = default;  ///< for_planning()'s

  Model& model_;
  bool shards_units_;
  ZeroOptions options_;
  DataCheck check_;                 ///< adopt()'s, for check_once_sharded()
  bool deferred_at_start_ = false;  ///< the model had no values when the run started (its units are sharded)
};

/// Whether ZeRO stage `zero_stage` shards the model's units' parameters (stage 3): `mpiddp train`
/// builds a deferred model there.
bool shards_units(int zero_stage);

}  // namespace mpiddp::detail
