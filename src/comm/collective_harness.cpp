// The collective harness (collective_harness.hpp): the shared pattern, buffers, tolerance and check.
#include "comm/collective_harness.hpp"

#include <mpiddp/error.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <vector>

namespace mpiddp::detail {

torch::Tensor pattern(int r, int64_t first, int64_t count) {
  auto idx = torch::arange(first, first + count, torch::kLong);
  return ((idx + 3 * r) % 5 + 1).to(torch::kDouble);
}

torch::Tensor reduced_pattern(ReduceOp op, int n, int64_t first, int64_t count) {
  torch::Tensor acc = pattern(0, first, count);
  for (int r = 1; r < n; ++r) {
    auto x = pattern(r, first, count);
    acc = op == ReduceOp::kMin ? torch::minimum(acc, x) : op == ReduceOp::kMax ? torch::maximum(acc, x) : acc + x;
  }
  return op == ReduceOp::kAvg ? acc / n : acc;
}

double tolerance(Collective c, c10::ScalarType dtype, ReduceOp op) {
  if (!traits(c).reduces || op != ReduceOp::kAvg) return 0.0;
  switch (dtype) {
    case c10::kBFloat16:
      return 1e-2;
    case c10::kHalf:
      return 1e-3;
    case c10::kFloat:
      return 1e-6;
    default:
      return 1e-12;
  }
}

CollectiveBuffers make_buffers(Collective c, int64_t elements, const torch::TensorOptions& options, bool in_place,
                               int rank, int n) {
  const auto& t = traits(c);
  MPIDDP_CHECK(!t.splits() || elements % n == 0, std::string(t.name) + " of " + std::to_string(elements) +
                                                     " elements does not split in " + std::to_string(n) + " parts");
  const int64_t part = elements / n;
  CollectiveBuffers b;
  switch (t.counts) {
    case CountRule::kGather:
      b.output = torch::zeros({elements}, options);
      b.input = in_place ? b.output.narrow(0, rank * part, part) : torch::zeros({part}, options);
      break;
    case CountRule::kScatter:
      b.input = torch::zeros({elements}, options);
      b.output = in_place ? b.input.narrow(0, rank * part, part) : torch::zeros({part}, options);
      break;
    case CountRule::kSame:
    case CountRule::kExchange:
      b.input = torch::zeros({elements}, options);
      b.output = in_place ? b.input : torch::zeros({elements}, options);
      break;
    case CountRule::kNone:
      break;
  }
  return b;
}

int64_t count_wrong(const torch::Tensor& got, const torch::Tensor& expected, double tol) {
  const auto g = got.reshape(-1).to(torch::kCPU, torch::kDouble);
  const auto e = expected.reshape(-1).to(torch::kCPU, torch::kDouble);
  const int64_t k = std::min(g.numel(), e.numel());
  const auto diff = (g.narrow(0, 0, k) - e.narrow(0, 0, k)).abs();
  const auto bound = e.narrow(0, 0, k).abs().clamp_min(1.0) * tol;
  return (g.numel() != e.numel() ? 1 : 0) + (diff > bound).sum().item<int64_t>();
}

int64_t verify(ProcessGroup& pg, Collective c, const CollectiveBuffers& b, const CollectiveArgs& a, bool on_device) {
  const auto& row = harness(c);
  const int r = pg.rank();
  // The output first: in place, the input is (part of) it, and its values are the input's.
  if (b.output.defined()) b.output.fill_(kUnwritten);
  if (b.input.defined()) b.input.copy_(row.input(r, b.input.numel(), a));
  auto work = row.start(pg, b, a);
  if (on_device) {
    work->wait_on_device();
  } else {
    work->wait();
  }
  const auto& t = traits(c);
  if (!t.has_data()) return 0;
  const int64_t elements = t.array_elements(b.input.numel(), b.output.numel());
  return count_wrong(b.output, row.expected(r, pg.size(), elements, a), tolerance(c, b.output.scalar_type(), a.op));
}

}  // namespace mpiddp::detail
