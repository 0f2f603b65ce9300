// DDP's all-reduce, plain or compressed on the wire (the GradientReduction strategy, reduction.hpp).
#include <mpiddp/ddp.hpp>
#include <mpiddp/error.hpp>
#include <mpiddp/precision.hpp>
#include <mpiddp/reduction.hpp>

#include <algorithm>

#include "common/even_share.hpp"
#include "common/text.hpp"
#include "ddp/averaging.hpp"

namespace mpiddp {

namespace {

// What gradients may travel in; their names (parse_compression's) are precision_name's.
constexpr c10::ScalarType kWireDtypes[] = {c10::kBFloat16, c10::kHalf};

}  // namespace

void check_wire_dtype(c10::ScalarType wire) {
  std::vector<std::string> takes;
  for (const auto dtype : kWireDtypes) {
    if (dtype == wire) return;
    takes.push_back(dtype_name(dtype));
  }
  MPIDDP_THROW("gradient compression takes " + detail::joined(takes, " or ") + ", not " + dtype_name(wire));
}

std::vector<std::string> compression_names() {
  std::vector<std::string> names{"none"};
  for (const auto dtype : kWireDtypes) names.push_back(precision_name(dtype));
  return names;
}

std::optional<c10::ScalarType> parse_compression(const std::string& name, const std::string& what) {
  if (name == "none") return std::nullopt;
  for (const auto dtype : kWireDtypes) {
    if (precision_name(dtype) == name) return dtype;
  }
  MPIDDP_THROW(detail::unknown_name(what, name, compression_names()));
}

namespace {

class AllReduce : public GradientReduction {
 public:
  AllReduce(std::optional<c10::ScalarType> wire, bool pad_to_ranks) : wire_(wire), pad_to_ranks_(pad_to_ranks) {
    if (wire_) check_wire_dtype(*wire_);
  }

  std::string name() const override { return "allreduce"; }
  int zero_stage() const override { return pad_to_ranks_ ? 1 : 0; }
  int64_t padded(int64_t numel, int ranks) const override {
    return pad_to_ranks_ ? detail::round_up(numel, ranks) : numel;
  }

  void attach(const std::vector<BucketLayout>& buckets, const std::vector<torch::TensorOptions>& options,
              ProcessGroup& pg) override {
    MPIDDP_CHECK(pg_ == nullptr, "a GradientReduction serves one DistributedDataParallel: make one per DDP");
    pg_ = &pg;
    buckets_ = buckets;
    divisors_ = detail::divisors(options, pg.size());
    wires_.assign(options.size(), torch::Tensor());
  }

  WorkHandle launch(size_t b, const torch::Tensor& buffer) override {
    if (!wire_) return pg_->allreduce_async(buffer, buffer, ReduceOp::kSum);
    wires_[b] = buffer.to(*wire_);
    return pg_->allreduce_async(wires_[b], wires_[b], ReduceOp::kSum);
  }

  void finish(size_t b, const torch::Tensor& buffer) override {
    if (wire_) buffer.copy_(wires_[b]);
    release(b);
    detail::average(buffer, divisors_[b], pg_->size());
  }

  void release(size_t b) override {
    if (b < wires_.size()) wires_[b] = torch::Tensor();
  }

  torch::Tensor owned_gradient(size_t b, const torch::Tensor& buffer) const override {
    const detail::Share slice = detail::share_of(buckets_[b].padded, pg_->rank(), pg_->size());
    return buffer.narrow(0, slice.first, slice.count);
  }

 private:
  std::optional<c10::ScalarType> wire_;
  bool pad_to_ranks_;
  ProcessGroup* pg_ = nullptr;
  std::vector<BucketLayout> buckets_;
  std::vector<torch::Tensor> divisors_;  ///< per bucket (see detail::divisors)
  std::vector<torch::Tensor> wires_;     ///< per bucket: the compressed copy while it travels
};

}  // namespace

int64_t GradientReduction::bucket_cap(int64_t gradient_bytes) const {
  if (zero_stage() == 0) return kDefaultBucketCapBytes;
  return std::clamp(gradient_bytes / 16, int64_t{1} << 20, kDefaultBucketCapBytes);
}

std::shared_ptr<GradientReduction> all_reduce(std::optional<c10::ScalarType> wire, bool pad_to_ranks) {
  return std::make_shared<AllReduce>(wire, pad_to_ranks);
}

}  // namespace mpiddp
