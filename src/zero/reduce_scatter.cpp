// ZeRO's gradient reductions (zero.hpp): stage 1 all-reduces buffers padded to the ranks, stages 2
// and 3 reduce-scatter each bucket as backward fills it and keeps only this rank's slice of the average.
#include <mpiddp/error.hpp>
#include <mpiddp/zero.hpp>

#include "ddp/averaging.hpp"
#include "zero/slice.hpp"

namespace mpiddp {

void check_zero_stage(int stage, const std::string& name) {
  MPIDDP_CHECK(stage >= 0 && stage <= kMaxZeroStage,
               name + " must be 0 (DDP), 1 (optimizer state sharded), 2 (and gradients) or 3 (and parameters), got " +
                   std::to_string(stage));
}

namespace {

// Stages 2 and 3: a bucket's buffer is transient (DDP makes it at the bucket's first gradient and drops it
// once its collective completed); the average stays in `shards_`, this rank's 1/N of each bucket.
class ReduceScatter : public GradientReduction {
 public:
  ReduceScatter(int stage, std::optional<c10::ScalarType> wire) : stage_(stage), wire_(wire) {
    if (wire_) check_wire_dtype(*wire_);
  }

  std::string name() const override { return "reduce-scatter"; }
  int zero_stage() const override { return stage_; }
  int64_t padded(int64_t numel, int ranks) const override { return detail::round_up(numel, ranks); }
  bool keeps_buffer() const override { return false; }

  void attach(const std::vector<BucketLayout>& buckets, const std::vector<torch::TensorOptions>& options,
              ProcessGroup& pg) override {
    MPIDDP_CHECK(pg_ == nullptr, "a GradientReduction serves one DistributedDataParallel: make one per DDP");
    pg_ = &pg;
    // Left unwritten until a reduce-scatter writes them whole or someone asks for them (zeroed
    // then): untouched pages take no memory, so at stage 3 they come after the model as built went.
    for (size_t b = 0; b < buckets.size(); ++b)
      shards_.push_back(torch::empty({detail::slice_numel(buckets[b], pg.size())}, options[b]));
    written_.assign(buckets.size(), false);
    divisors_ = detail::divisors(options, pg.size());
    wires_.assign(buckets.size(), {});
  }

  WorkHandle launch(size_t b, const torch::Tensor& buffer) override {
    written_[b] = true;
    if (!wire_) return pg_->reduce_scatter_async(buffer, shards_[b], ReduceOp::kSum);
    auto& [whole, slice] = wires_[b];
    whole = buffer.to(*wire_);
    slice = torch::empty({shards_[b].numel()}, whole.options());
    return pg_->reduce_scatter_async(whole, slice, ReduceOp::kSum);
  }

  void finish(size_t b, const torch::Tensor& /*buffer*/) override {
    if (wire_) shards_[b].copy_(wires_[b].second);
    release(b);
    detail::average(shards_[b], divisors_[b], pg_->size());
  }

  void sent(size_t b) override { wires_[b].first = torch::Tensor(); }  // the compressed bucket went out

  void release(size_t b) override {
    if (b < wires_.size()) wires_[b] = {};
  }

  torch::Tensor owned_gradient(size_t b, const torch::Tensor& /*buffer*/) const override {
    if (!written_[b]) {
      shards_[b].zero_();
      written_[b] = true;
    }
    return shards_[b];
  }

 private:
  int stage_;
  std::optional<c10::ScalarType> wire_;
  ProcessGroup* pg_ = nullptr;
  std::vector<torch::Tensor> shards_;
  mutable std::vector<bool> written_;  ///< each shard written (reduced into, or zeroed when first asked for)
  std::vector<torch::Tensor> divisors_;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> wires_;  ///< compressed: the bucket and the slice on the wire
};

}  // namespace

std::shared_ptr<GradientReduction> zero_reduction(int stage, std::optional<c10::ScalarType> wire) {
  check_zero_stage(stage, "ZeRO stage");
  if (stage >= 2) return std::make_shared<ReduceScatter>(stage, wire);
  return all_reduce(wire, /*pad_to_ranks=*/stage == 1);
}

}  // namespace mpiddp
