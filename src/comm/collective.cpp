#include <mpiddp/collective.hpp>

namespace mpiddp {

namespace {

// In the enum's order: traits() indexes by it.
const std::vector<CollectiveTraits> kCollectives = {
    // kind                       name              reduces rooted counts               ring passes
    {Collective::kAllreduce, "allreduce", true, false, CountRule::kSame, 2},
    {Collective::kBroadcast, "broadcast", false, true, CountRule::kSame, 0},
    {Collective::kAllgather, "allgather", false, false, CountRule::kGather, 1},
    {Collective::kReduceScatter, "reduce_scatter", true, false, CountRule::kScatter, 1},
    {Collective::kAlltoall, "alltoall", false, false, CountRule::kExchange, 1},
    {Collective::kBarrier, "barrier", false, false, CountRule::kNone, 0},
};

}  // namespace

const CollectiveTraits& traits(Collective c) { return kCollectives[static_cast<size_t>(c)]; }
const std::vector<CollectiveTraits>& collectives() { return kCollectives; }

}  // namespace mpiddp
