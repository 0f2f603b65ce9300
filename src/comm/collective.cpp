// The table of collectives (include/mpiddp/collective.hpp): one row per collective, holding both
// what every backend reads (its traits) and what the harness runs and checks it by
// (comm/collective_harness.hpp: its ProcessGroup call, rank r's input, rank r's expected output).
#include <mpiddp/collective.hpp>

#include <torch/torch.h>

#include <vector>

#include "comm/collective_harness.hpp"

namespace mpiddp {

namespace {

using detail::CollectiveArgs;
using detail::CollectiveBuffers;
using detail::HarnessRow;
using detail::kUnwritten;
using detail::pattern;
using detail::reduced_pattern;

struct CollectiveRow {
  CollectiveTraits traits;
  HarnessRow harness;
};

// Every rank's input is its pattern (the first `numel` elements).
torch::Tensor every_rank_input(int r, int64_t numel, const CollectiveArgs& /*a*/) { return pattern(r, 0, numel); }

// Only the root's input is read: the others' hold kUnwritten, so a rank whose output stayed its input
// counts as wrong.
torch::Tensor root_input(int r, int64_t numel, const CollectiveArgs& a) {
  return r == a.root ? pattern(r, 0, numel) : torch::full({numel}, kUnwritten, torch::kDouble);
}

// Part q of the whole array (S = `s` elements, n parts) is `part(q)`.
template <typename Part>
torch::Tensor parts(int n, Part part) {
  std::vector<torch::Tensor> all;
  for (int q = 0; q < n; ++q) all.push_back(part(q));
  return torch::cat(all);
}

// In the enum's order: traits() and harness() index by it. Each row: kind, name, reduces, rooted,
// how the counts relate, nccl-tests' ring passes; its ProcessGroup call; rank r's input; rank r's
// output as a closed form of the pattern (S = `s` elements of the whole array, n parts).
const std::vector<CollectiveRow> kRows = {
    {{Collective::kAllreduce, "allreduce", true, false, CountRule::kSame, 2},
     {[](ProcessGroup& pg, const CollectiveBuffers& b, const CollectiveArgs& a) {
        return pg.allreduce_async(b.input, b.output, a.op);
      },
      every_rank_input,
      // op over ranks of the whole array.
      [](int /*r*/, int n, int64_t s, const CollectiveArgs& a) { return reduced_pattern(a.op, n, 0, s); }}},
    {{Collective::kBroadcast, "broadcast", false, true, CountRule::kSame, 0},
     {[](ProcessGroup& pg, const CollectiveBuffers& b, const CollectiveArgs& a) {
        return pg.broadcast_async(b.input, b.output, a.root);
      },
      root_input,
      // The root's array.
      [](int /*r*/, int /*n*/, int64_t s, const CollectiveArgs& a) { return pattern(a.root, 0, s); }}},
    {{Collective::kAllgather, "allgather", false, false, CountRule::kGather, 1},
     {[](ProcessGroup& pg, const CollectiveBuffers& b, const CollectiveArgs& /*a*/) {
        return pg.allgather_async(b.input, b.output);
      },
      every_rank_input,
      // Part q is rank q's input (its pattern's first S/n elements).
      [](int /*r*/, int n, int64_t s, const CollectiveArgs& /*a*/) {
        return parts(n, [&](int q) { return pattern(q, 0, s / n); });
      }}},
    {{Collective::kReduceScatter, "reduce_scatter", true, false, CountRule::kScatter, 1},
     {[](ProcessGroup& pg, const CollectiveBuffers& b, const CollectiveArgs& a) {
        return pg.reduce_scatter_async(b.input, b.output, a.op);
      },
      every_rank_input,
      // op over ranks of part r.
      [](int r, int n, int64_t s, const CollectiveArgs& a) { return reduced_pattern(a.op, n, r * (s / n), s / n); }}},
    {{Collective::kAlltoall, "alltoall", false, false, CountRule::kExchange, 1},
     {[](ProcessGroup& pg, const CollectiveBuffers& b, const CollectiveArgs& /*a*/) {
        return pg.alltoall_async(b.input, b.output);
      },
      every_rank_input,
      // Part q is part r of rank q's input.
      [](int r, int n, int64_t s, const CollectiveArgs& /*a*/) {
        return parts(n, [&](int q) { return pattern(q, r * (s / n), s / n); });
      }}},
    {{Collective::kBarrier, "barrier", false, false, CountRule::kNone, 0},
     {[](ProcessGroup& pg, const CollectiveBuffers& /*b*/, const CollectiveArgs& /*a*/) { return pg.barrier_async(); },
      nullptr,  // a barrier has no buffers
      nullptr}},
};

std::vector<CollectiveTraits> traits_of(const std::vector<CollectiveRow>& rows) {
  std::vector<CollectiveTraits> all;
  for (const auto& row : rows) all.push_back(row.traits);
  return all;
}

const std::vector<CollectiveTraits> kTraits = traits_of(kRows);

}  // namespace

const CollectiveTraits& traits(Collective c) { return kTraits.at(static_cast<size_t>(c)); }
const std::vector<CollectiveTraits>& collectives() { return kTraits; }

namespace detail {
const HarnessRow& harness(Collective c) { return kRows.at(static_cast<size_t>(c)).harness; }
}  // namespace detail

}  // namespace mpiddp
