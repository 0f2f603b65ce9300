// GradientReduction: how DistributedDataParallel's buckets are reduced across the ranks, the
// strategy DDP holds. DDP owns the hooks, the bucket order, no_sync and each bucket's buffer (its
// gradients, flat, in layout order); the reduction says how large a bucket's buffer is, whether the
// buffer outlives the step, starts the bucket's collective once it is full, and when that collective
// is done leaves the average where this rank's gradient lives afterwards:
//   all_reduce()             every rank holds every averaged gradient in the buffer (DDP);
//   all_reduce(bf16 / f16)   the same with the sum taken over a compressed copy on the wire;
//   ZeRO's (zero.hpp)        stage 1: an all-reduce of buffers padded to a multiple of the world
//                            size; stage 2: a reduce-scatter, each rank keeps only its slice.
//
// The mean tail (DdpOptions::mean_tail_values, the Trainer's per-step agreement) rides at the end
// of the last bucket's buffer when the reduction averages whole buffers (keeps_buffer()); otherwise
// DDP reduces it as a bucket of its own with all_reduce(), after the others. Either way its values
// are the mean over the ranks after each reducing backward.
//
// Cross-rank contract: every rank holds the same kind of reduction, attached to the same layouts;
// DDP calls launch() for bucket 0, 1, ... in that order on every rank, then finish() for each.
#pragma once

#include <mpiddp/process_group.hpp>

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mpiddp {

/// One bucket: which parameters (indices into DDP's parameters()) and where each lies in the flat buffer.
struct BucketLayout {
  std::vector<size_t> params;
  std::vector<int64_t> offsets;  ///< element offset of each parameter in the bucket
  int64_t numel = 0;
  /// Elements of the bucket's buffer: GradientReduction::padded(numel) (zeros after the last
  /// parameter). Under ZeRO, rank r's shard is elements [r * padded / N, (r + 1) * padded / N).
  int64_t padded = 0;
  c10::ScalarType dtype = c10::kFloat;
  /// The group (DdpOptions::bucket_groups) whose parameters these are, or -1: in no group.
  int group = -1;
};

class GradientReduction {
 public:
  virtual ~GradientReduction() = default;
  /// What the timeline calls a bucket's collective ("allreduce", "reduce-scatter").
  virtual std::string name() const = 0;
  /// The ZeRO stage this reduction serves (0: DDP, every rank holds every averaged gradient).
  virtual int zero_stage() const { return 0; }
  /// Whether the parameters of DDP's bucket groups are sharded along with their gradients (ZeRO
  /// stage 3): only those may come deferred (units.hpp), initialised as they are sharded.
  bool shards_group_parameters() const { return zero_stage() >= 3; }
  /// The bucket cap DDP takes when DdpOptions::bucket_cap_bytes is kAutoBucketCap, for a model of
  /// `gradient_bytes` gradient bytes: PyTorch's 25 MiB for DDP; under ZeRO a 16th of the gradient,
  /// from 1 MiB to 25 MiB, since a bucket in flight is memory that sharding does not save.
  int64_t bucket_cap(int64_t gradient_bytes) const;
  /// Elements of a bucket's buffer holding `numel` gradient elements, on `ranks` ranks.
  virtual int64_t padded(int64_t numel, int /*ranks*/) const { return numel; }
  /// True: the buffer holds the average after finish() and lives across steps (each .grad is a view
  /// of it). False: the buffer lives from a bucket's first gradient to the end of its collective,
  /// and the average lives in owned_gradient() alone.
  virtual bool keeps_buffer() const { return true; }
  /// Once, before any launch: the buckets (padded already), the options of each bucket's buffer. A
  /// reduction serves one DDP (attaching it twice is an error).
  virtual void attach(const std::vector<BucketLayout>& buckets, const std::vector<torch::TensorOptions>& options,
                      ProcessGroup& pg) = 0;
  /// Starts bucket b's collective over `buffer` (the bucket's summed gradients, and the mean tail
  /// after them in the last one).
  virtual WorkHandle launch(size_t b, const torch::Tensor& buffer) = 0;
  /// After bucket b's collective completed: the average where this rank's gradient lives (the
  /// buffer, or this rank's slice), and what launch() kept for the wire released.
  virtual void finish(size_t b, const torch::Tensor& buffer) = 0;
  /// Bucket b's collective completed, before finish(): what only the wire needed may go (with a
  /// transient buffer, DDP drops the buffer then too).
  virtual void sent(size_t /*b*/) {}
  /// Releases what launch() holds for bucket b besides the buffer (a pass that failed).
  virtual void release(size_t /*b*/) {}
  /// This rank's 1/N slice of bucket b's averaged gradient, after a reducing backward: for ZeRO's
  /// sharded step. `buffer` is the bucket's buffer (undefined when !keeps_buffer()).
  virtual torch::Tensor owned_gradient(size_t b, const torch::Tensor& buffer) const = 0;
};

/// DDP's reduction: each bucket all-reduced and averaged in its buffer; with `wire` (bfloat16 or
/// float16) the sum is taken over a copy in that dtype and accumulated back into the buffer's own.
/// `pad_to_ranks`: buffers padded to a multiple of the world size (ZeRO stage 1's layout).
std::shared_ptr<GradientReduction> all_reduce(std::optional<c10::ScalarType> wire = std::nullopt,
                                              bool pad_to_ranks = false);

/// The one rule for what travels compressed: bfloat16 or float16, else mpiddp::Error.
void check_wire_dtype(c10::ScalarType wire);
/// The compressions by name, in order: none, bf16, fp16 (`mpiddp train --compression`).
std::vector<std::string> compression_names();
/// "none" -> nullopt (no compression), "bf16" -> kBFloat16, "fp16" -> kHalf: a DdpOptions::compression.
/// Throws mpiddp::Error "unknown <what> '<name>' (none, bf16, fp16)" on any other name.
std::optional<c10::ScalarType> parse_compression(const std::string& name, const std::string& what = "compression");

}  // namespace mpiddp
