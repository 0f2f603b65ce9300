// DistributedDataParallel: data parallelism for any torch::nn::Module over a ProcessGroup.
//
// Cross-rank contract (as PyTorch's reducer): parameters are assigned to buckets in reverse
// registration order (the order backward produces gradients); a bucket's all-reduce starts as
// soon as all its gradients are in, but buckets are always launched in index order, so every
// rank issues the same sequence of collectives whatever order its hooks fire in. Parameters that
// got no gradient in a step contribute zeros, launched at the end of backward, so an unused
// parameter on some ranks never leaves the others waiting.
//
// Use per step, as with PyTorch:
//   optimizer.zero_grad();              // or ddp.zero_grad(): one fill per bucket
//   auto loss = loss_fn(model->forward(x), y);
//   loss.backward();                    // returns with every .grad averaged over the ranks
//   optimizer.step();
// The reduction completes inside backward: the first gradient hook of a pass queues a callback
// on the autograd engine that launches what is left, waits for every bucket, averages and
// re-broadcasts buffers from rank 0, before loss.backward() returns. A backward that throws
// leaves DDP usable: what the aborted pass launched is finished while autograd unwinds.
// After a step each parameter's .grad is a view of its bucket (as PyTorch DDP's
// gradient_as_bucket_view): keep a copy, not the tensor, to hold a gradient past the next step.
// Inside `auto guard = ddp.no_sync();` backward accumulates locally without communication.
// How each bucket travels is the GradientReduction's (reduction.hpp): all-reduce by default,
// compressed on the wire, or ZeRO's sharded reductions (zero.hpp).
#pragma once

#include <mpiddp/compat.hpp>
#include <mpiddp/process_group.hpp>
#include <mpiddp/reduction.hpp>
#include <mpiddp/timeline.hpp>

#include <torch/torch.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mpiddp {

/// Default bucket caps, as PyTorch DDP: 25 MiB, and 1 MiB for the first bucket (the last
/// layers' gradients, ready first) so communication starts early.
constexpr int64_t kDefaultBucketCapBytes = 25LL << 20;
constexpr int64_t kDefaultFirstBucketCapBytes = 1LL << 20;

/// Transient bucket buffers (ZeRO 2-3's reduce-scatter) launched and not yet finished, at most: an
/// older one is waited for before the next launch (besides them, the bucket being filled).
constexpr size_t kTransientBuffersInFlight = 2;

/// DdpOptions::bucket_cap_bytes: the reduction's rule (GradientReduction::bucket_cap).
constexpr int64_t kAutoBucketCap = 0;

struct DdpOptions {
  int64_t bucket_cap_bytes = kAutoBucketCap;
  int64_t first_bucket_cap_bytes = kDefaultFirstBucketCapBytes;
  /// Re-broadcast buffers (BatchNorm running statistics) from rank 0 before each forward.
  bool broadcast_buffers = true;
  /// How buckets are reduced (reduction.hpp); nullptr: all_reduce(compression).
  std::shared_ptr<GradientReduction> reduction;
  /// Send gradients as bfloat16 or float16 (halves the bytes) with the default reduction; results
  /// are accumulated back into the parameters' own dtype. nullopt: no compression. A reduction
  /// given above takes its wire dtype itself (zero_reduction(stage, wire)).
  std::optional<c10::ScalarType> compression;
  /// Chrome-trace file (see Timeline); empty: the MPIDDP_TIMELINE environment variable, if set.
  std::string timeline_path;
  /// Values whose mean over the ranks each reducing backward computes beside the gradients, with no
  /// collective of its own when the reduction averages whole buffers (they ride at the end of the
  /// last bucket: see reduction.hpp). Write mean_tail() before a reducing backward, read the ranks'
  /// mean there after it (in the last bucket's dtype and, riding there, rounded like its gradients
  /// when compressed; travelling alone, float32 and uncompressed). The
  /// Trainer's per-step agreement (stop and non-finite loss flags) travels here.
  int64_t mean_tail_values = 0;
  /// Groups of parameters whose buckets hold no other group's (a sharding's groups: ZeRO stage 3
  /// gives a model's units, each sharded and gathered by its own buckets); each group, and the
  /// tensors in no group, are bucketed by the caps.
  std::vector<std::vector<torch::Tensor>> bucket_groups;
};

/// The bucket assignment rule as a pure function: parameters in reverse order of `sizes_bytes`
/// (registration order), a new bucket when the dtype changes or the cap would be exceeded (the
/// first bucket's cap is `first_cap`); a parameter larger than the cap gets a bucket of its own.
/// `group_of` (empty: none): each parameter's bucket group or -1; no bucket holds two groups'
/// parameters (a group's are bucketed by the caps, apart from the others').
std::vector<BucketLayout> assign_buckets(const std::vector<int64_t>& numels, const std::vector<c10::ScalarType>& dtypes,
                                         int64_t cap_bytes, int64_t first_cap_bytes,
                                         const std::vector<int>& group_of = {});

struct DdpStats {
  int64_t steps = 0;                    ///< synchronised backward passes
  int64_t buckets_launched_early = 0;   ///< launched from a gradient hook, during backward
  int64_t buckets_launched_at_end = 0;  ///< launched at the end of backward (unused parameters)
  int64_t aborted_passes = 0;           ///< backward passes that threw after gradients arrived
};

class DistributedDataParallel {
 public:
  /// Broadcasts parameters and buffers from rank 0 after checking that every rank holds the same
  /// parameter names, shapes and dtypes (else mpiddp::Error on every rank naming the first
  /// difference); deferred parameters (units.hpp), which only a stage-3 reduction takes, are
  /// broadcast by the ZeroOptimizer as it initialises them. Collective.
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, ProcessGroup& pg, DdpOptions options = {});
  /// The same for a model given as its named parameters and buffers (a TorchScript module, a
  /// mpiddp::Model): parameters with requires_grad are reduced, the others and the buffers are
  /// broadcast from rank 0.
  DistributedDataParallel(const std::vector<std::pair<std::string, torch::Tensor>>& parameters,
                          const std::vector<std::pair<std::string, torch::Tensor>>& buffers, ProcessGroup& pg,
                          DdpOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  /// The module given to the constructor (nullptr when built from named tensors).
  std::shared_ptr<torch::nn::Module> module() const { return module_; }
  ProcessGroup& process_group() { return pg_; }
  const std::vector<BucketLayout>& buckets() const { return layouts_; }
  /// How many groups DdpOptions::bucket_groups gave (a group may have no bucket: none trainable).
  size_t bucket_group_count() const { return options_.bucket_groups.size(); }
  /// The parameters it reduces (requires_grad, each tensor once), in registration order: the
  /// indices of BucketLayout::params.
  const std::vector<torch::Tensor>& parameters() const { return params_; }
  /// The strategy that reduces the buckets.
  const GradientReduction& reduction() const { return *reduction_; }
  /// This rank's 1/N slice of bucket b's averaged gradient (BucketLayout::padded / N elements),
  /// written by every reducing backward: what ZeRO steps.
  torch::Tensor owned_gradient(size_t b) const;
  const DdpStats& stats() const { return stats_; }
  /// The DdpOptions::mean_tail_values slots (undefined when there are none): local values before a
  /// reducing backward, the mean over the ranks after it. zero_grad() zeroes them too.
  torch::Tensor mean_tail() const { return mean_tail_; }
  Timeline* timeline() { return timeline_.get(); }

  /// Re-broadcasts buffers from rank 0 now (when enabled). Not needed per step: every reducing
  /// backward ends with that broadcast. Collective.
  void prepare_forward();
  /// loss.backward(), then finish_backward(); the same as loss.backward() alone, plus a
  /// "backward" span in the timeline.
  void backward(const torch::Tensor& loss);
  /// Only for a backward pass in which no parameter received a gradient (say, a loss that does
  /// not depend on the model on this rank): this rank then joins the other ranks' reduction with
  /// zeros. After any other pass it does nothing, as backward already reduced. Collective then.
  void finish_backward();
  /// Zeroes the gradients: one fill per bucket instead of one per parameter (the optimizer's
  /// zero_grad() is equally correct). Local.
  void zero_grad();

  /// While alive, backward accumulates gradients locally and communicates nothing; the next
  /// backward outside it reduces the accumulated sum.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel* ddp) : ddp_(ddp) { ddp_->sync_ = false; }
    ~NoSync() { ddp_->sync_ = true; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel* ddp_;
  };
  NoSync no_sync() { return NoSync(this); }

 private:
  struct Bucket;
  struct GradientReady;  ///< the post-hook on each parameter's AccumulateGrad
  struct Pass {          ///< one reducing backward pass; owned by its callback on the engine
    DistributedDataParallel* ddp = nullptr;
    bool reduced = false;
    ~Pass();  ///< dropped unrun (backward threw): ddp->abandon_pass()
  };
  void setup(const std::vector<std::pair<std::string, torch::Tensor>>& parameters,
             const std::vector<std::pair<std::string, torch::Tensor>>& buffers);
  void verify_same_model();
  void broadcast_tensors(const std::vector<torch::Tensor>& tensors);
  void on_gradient(size_t param);
  void adopt_gradient(size_t param);
  void make_buckets();
  void check_deferred(const std::vector<std::pair<std::string, torch::Tensor>>& parameters) const;
  std::vector<int> group_of_parameters() const;  ///< per parameter: its DdpOptions::bucket_groups group, or -1
  void add_mean_tail(const std::vector<std::pair<std::string, torch::Tensor>>& parameters);
  void make_gradient_views();
  void add_gradient_hooks();
  torch::Tensor& buffer(Bucket& b);  ///< the bucket's buffer (a transient one made when first needed)
  void bound_transient_buffers();    ///< waits for old buckets to drop their transient buffers
  void sent(Bucket& b);              ///< its collective completed: a transient buffer goes
  void launch_ready_buckets(bool at_end);
  void launch(Bucket& b);
  void poll_launched();
  void finish_reduction();
  void abandon_pass() noexcept;
  void rethrow_abandoned_error();
  void reset_buckets();

  std::shared_ptr<torch::nn::Module> module_;
  ProcessGroup& pg_;
  DdpOptions options_;
  std::vector<std::string> names_;
  std::vector<torch::Tensor> params_;  ///< those with requires_grad, registration order
  std::vector<torch::Tensor> buffers_;
  std::vector<BucketLayout> layouts_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<std::pair<size_t, size_t>> where_;  ///< param -> (bucket, slot)
  std::vector<torch::Tensor> views_;              ///< param -> its gradient's place in its bucket
  std::shared_ptr<GradientReduction> reduction_;
  std::shared_ptr<GradientReduction> tail_reduction_;  ///< the mean tail's, when it travels alone
  torch::Tensor mean_tail_;                            ///< the mean tail: the end of the last bucket's buffer
  torch::Tensor seed_;                                 ///< backward()'s d(loss)/d(loss) = 1, reused
  std::vector<std::pair<compat::GradAccumulatorPtr, uintptr_t>> hooks_;  ///< accumulator, hook key
  size_t next_to_launch_ = 0;
  bool sync_ = true;
  std::weak_ptr<Pass> pass_;            ///< the pass under way, if any
  std::exception_ptr abandoned_error_;  ///< raised while settling a pass that threw; rethrown next
  int64_t steps_seen_ = 0;              ///< stats_.steps at the last finish_backward()
  DdpStats stats_;
  std::unique_ptr<Timeline> timeline_;
};

}  // namespace mpiddp
