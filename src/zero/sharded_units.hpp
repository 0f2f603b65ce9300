// ZeRO stage 3's parameters (zero.hpp): each bucket of a unit (BucketLayout::group >= 0: the units are DDP's bucket
// groups) keeps this rank's 1/N slice of its parameters, and the parameters themselves are views of one flat buffer per
// bucket whose memory exists only while their unit is gathered (FSDP's flat parameter). A unit's forward may borrow
// other units (a tied weight): "unit u's set" is u and those it borrows.
//   forward   run(u): u's set gathered (or its prefetch awaited), unit u + 1's set's all-gathers
//             started, u's forward, u's set freed but for what u + 1 needs (reshard_after_forward),
//             a hook on u's output for backward;
//   backward  that hook, before u's backward (and before a checkpointed unit's recompute): every
//             unit freed but u's set and u - 1's (the later units' gradients are in), u's set
//             gathered, u - 1's set's all-gathers started; at the end of the pass every unit freed.
// A freed buffer keeps its tensors' shapes and autograd's saved references; only its storage's
// bytes go (resized to 0 and allocated again before the next gather writes them).
//
// Cross-rank contract: every rank runs the same units in the same order (forward and backward),
// borrowing alike, so the all-gathers match; each all-gather is started and awaited in unit order.
#pragma once

#include <mpiddp/ddp.hpp>
#include <mpiddp/units.hpp>
#include <mpiddp/zero.hpp>

#include <torch/torch.h>

#include <memory>
#include <unordered_map>
#include <vector>

namespace mpiddp::detail {

class ShardedUnits final : public UnitHooks {
 public:
  /// Takes the parameters of `ddp`'s unit buckets: this rank's slice of each kept, the rest freed
  /// bucket by bucket. A failure (memory) leaves the buckets sharded so far NaN.
  ShardedUnits(DistributedDataParallel& ddp, const ZeroOptions& options);
  /// Leaves the parameters whole again: all-gathered into memory of their own (collective), or
  /// NaN when an exception is unwinding (no collective can be trusted then); without memory where
  /// ZeroOptions::whole_at_end is false.
  ~ShardedUnits() override;
  ShardedUnits(const ShardedUnits&) = delete;
  ShardedUnits& operator=(const ShardedUnits&) = delete;

  /// Whether bucket b's parameters are sharded (it belongs to a unit).
  bool sharded(size_t bucket) const { return buckets_[bucket].shard.defined(); }
  /// This rank's slice of bucket b (BucketLayout::padded / N elements), where its step writes.
  const torch::Tensor& shard(size_t bucket) const { return buckets_[bucket].shard; }
  /// Frees every gathered unit (waiting for all-gathers in flight): after a step they are stale.
  void release_all();

  torch::Tensor run(size_t unit, const UnitForward& forward, const torch::Tensor& input,
                    const std::vector<size_t>& borrowed) override;

 private:
  struct Bucket {
    torch::Tensor shard;                ///< this rank's slice, persistent (undefined: not a unit's bucket)
    torch::Tensor full;                 ///< the whole bucket; its storage holds bytes only while gathered
    WorkHandle gathering;               ///< the all-gather in flight into `full`
    bool live = false;                  ///< `full` has memory (gathered, or being gathered)
    std::vector<torch::Tensor> params;  ///< views of `full`
    std::vector<int64_t> offsets;       ///< each one's first element in `full`
  };
  struct Pass;  ///< one backward pass: frees every unit when it ends (or is dropped, on an error)
  /// Deferred initialisation: gives the unit's deferred parameters memory and their initial values.
  void initialise(size_t unit, const DistributedDataParallel& ddp);
  /// Keeps this rank's slice of bucket b and moves its parameters onto views of `full` (no bytes).
  void shard(size_t b, const BucketLayout& layout, const std::vector<torch::Tensor>& params);
  void start(size_t unit);                    ///< allocates the buffers of unit's set and starts their all-gathers
  void gather(size_t unit);                   ///< start(unit) if needed, and waits for it
  void release(size_t unit);                  ///< unit's own buffers: waits for an all-gather in flight, frees them
  bool in_set(size_t unit, size_t of) const;  ///< whether `unit` is in unit `of`'s set
  void before_backward(size_t unit);
  void make_whole(bool gather);             ///< the destructor's
  void give_bytes(const torch::Tensor& t);  ///< a spare buffer of t's size (or a new one) as t's storage's bytes
  void take_bytes(const torch::Tensor& t);  ///< t's storage's bytes back to the spares

  ProcessGroup& pg_;
  ZeroOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<std::vector<size_t>> buckets_of_unit_;  ///< per unit of the model (none: no trainable parameters)
  std::vector<std::vector<size_t>> set_of_unit_;      ///< each unit and those it borrows (as its last run said)
  std::unordered_map<size_t, std::vector<c10::DataPtr>> spare_;  ///< CPU: freed buffers by size, for reuse
  size_t spare_bytes_ = 0;                                       ///< the buffers' in spare_
  size_t max_spare_bytes_ = 0;                                   ///< twice the largest unit's
  std::weak_ptr<Pass> pass_;
  std::shared_ptr<ShardedUnits*> self_;  ///< hooks on autograd's graph hold a weak reference
};

}  // namespace mpiddp::detail
