// Each collective described once: its name, whether it reduces or has a root, how its input and
// output element counts relate, and nccl-tests' bus bandwidth factor. The ProcessGroup's argument
// checks and check-mode descriptors, the backends, `mpiddp bench` and the tests read this table.
// Adding a collective (nccl-tests' `struct testColl`) is its row in src/comm/collective.cpp (these
// traits with the harness's ProcessGroup call, input and expected output, which `mpiddp bench` and
// the tests run), its ProcessGroup method, and each backend's launch of it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mpiddp {

enum class ReduceOp { kSum, kAvg, kMin, kMax };
enum class Collective { kAllreduce, kBroadcast, kAllgather, kReduceScatter, kAlltoall, kBarrier };

/// How a collective's input and output element counts relate (n = world size).
enum class CountRule {
  kSame,      ///< input and output alike (allreduce, broadcast)
  kGather,    ///< output = n x input (allgather)
  kScatter,   ///< input = n x output (reduce_scatter)
  kExchange,  ///< input and output alike, divisible by n (alltoall)
  kNone,      ///< no tensors (barrier)
};

struct CollectiveTraits {
  Collective kind;
  const char* name;  ///< as `mpiddp bench --collective` and error messages spell it
  bool reduces;      ///< takes a ReduceOp
  bool rooted;       ///< takes a root rank
  CountRule counts;
  /// nccl-tests' busbw = algbw x ring_passes x (n-1)/n; 0 means a factor of 1 (broadcast).
  int ring_passes;

  /// busbw / algbw at `n` ranks.
  double bus_factor(int n) const {
    return ring_passes == 0 ? 1.0 : ring_passes * static_cast<double>(n - 1) / static_cast<double>(n);
  }
  /// Elements of the whole array (nccl-tests' S / element size) given the input and output counts.
  int64_t array_elements(int64_t input, int64_t output) const { return counts == CountRule::kGather ? output : input; }
  /// Whether the whole array splits in n equal parts (sizes must be multiples of n).
  bool splits() const {
    return counts == CountRule::kGather || counts == CountRule::kScatter || counts == CountRule::kExchange;
  }
  /// Whether it moves data (every collective but barrier).
  bool has_data() const { return counts != CountRule::kNone; }
};

/// The row of `c`.
const CollectiveTraits& traits(Collective c);
/// Every row, in the order `mpiddp bench --collective all` runs them.
const std::vector<CollectiveTraits>& collectives();

}  // namespace mpiddp
