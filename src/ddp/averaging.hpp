// What every gradient reduction does the same way: padding a bucket to a multiple of the ranks, and
// turning the ranks' sum into their mean.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "common/even_share.hpp"

namespace mpiddp::detail {

/// `numel` rounded up to a multiple of `ranks`: `ranks` times the largest even share of it.
inline int64_t round_up(int64_t numel, int ranks) { return largest_share(numel, ranks) * ranks; }

/// Per bucket, the world size as a 0-dim tensor of the bucket's dtype and device (float32 and
/// float64 buckets; undefined for the others, which divide by a Scalar computed in float32, and on
/// one rank). A tensor divisor is not wrapped and cast on every call, as a Scalar would be.
inline std::vector<torch::Tensor> divisors(const std::vector<torch::TensorOptions>& options, int ranks) {
  std::vector<torch::Tensor> out(options.size());
  for (size_t b = 0; b < options.size() && ranks > 1; ++b) {
    const auto t = c10::typeMetaToScalarType(options[b].dtype());
    if (t == torch::kFloat || t == torch::kDouble) out[b] = torch::scalar_tensor(ranks, options[b]);
  }
  return out;
}

/// The sum over `ranks` ranks in `summed` becomes their mean, in place.
inline void average(const torch::Tensor& summed, const torch::Tensor& divisor, int ranks) {
  if (divisor.defined()) {
    summed.div_(divisor);
  } else if (ranks > 1) {
    summed.div_(static_cast<double>(ranks));
  }
}

}  // namespace mpiddp::detail
