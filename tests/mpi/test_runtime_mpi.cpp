// Runtime at 1..4 ranks against direct MPI calls and the pure topology rule.
#include <mpiddp/diagnostics.hpp>
#include <mpiddp/error.hpp>
#include <mpiddp/runtime.hpp>

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <set>

#include "common/check.hpp"
#include "mpi_test.hpp"

using mpiddp::testing::on_all_ranks;
using mpiddp::testing::runtime;

namespace {

std::vector<long> allgather_keys(int key) {
  std::vector<int> keys(static_cast<size_t>(runtime().size()));
  MPI_Allgather(&key, 1, MPI_INT, keys.data(), 1, MPI_INT, MPI_COMM_WORLD);
  return std::vector<long>(keys.begin(), keys.end());
}

}  // namespace

TEST(Runtime, WorldMatchesDirectMpi) {
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPIDDP_EXPECT_ALL(runtime().rank() == rank && runtime().size() == size);
  MPIDDP_EXPECT_ALL(mpiddp::current_rank() == rank);
  MPIDDP_EXPECT_ALL(runtime().thread_level_provided() >= MPI_THREAD_SINGLE);
  int cmp = MPI_UNEQUAL;
  MPI_Comm_compare(runtime().world(), MPI_COMM_WORLD, &cmp);
  MPIDDP_EXPECT_ALL(cmp == MPI_CONGRUENT);  // a duplicate: same group, separate traffic
}

TEST(Runtime, HostnamesInRankOrder) {
  char name[HOST_NAME_MAX + 1] = {};
  gethostname(name, sizeof name);
  const auto& hosts = runtime().hostnames();
  MPIDDP_EXPECT_ALL(static_cast<int>(hosts.size()) == runtime().size());
  MPIDDP_EXPECT_ALL(runtime().hostname() == name);
}

TEST(Runtime, TopologyMatchesRuleOverHostnames) {
  // Independent reference: the pure rule applied to every rank's hostname as its node key.
  const auto& hosts = runtime().hostnames();
  std::vector<std::string> unique(hosts.begin(), hosts.end());
  std::sort(unique.begin(), unique.end());
  unique.erase(std::unique(unique.begin(), unique.end()), unique.end());
  std::vector<long> keys;
  for (const auto& h : hosts) keys.push_back(std::lower_bound(unique.begin(), unique.end(), h) - unique.begin());
  MPIDDP_EXPECT_ALL(runtime().topology() == mpiddp::topology_from_node_keys(runtime().rank(), keys));
}

TEST(Runtime, InjectedBlockNodesMatchFormula) {
  // Two ranks per "node": ranks {0,1} {2,3} ...
  const int r = runtime().rank(), n = runtime().size();
  mpiddp::Topology t = mpiddp::derive_topology(runtime().world(), r / 2);
  bool ok = t.rank == r && t.size == n && t.node_rank == r / 2 && t.node_count == (n + 1) / 2 &&
            t.local_rank == r % 2 && t.local_size == std::min(2, n - (r / 2) * 2);
  MPIDDP_EXPECT_ALL(ok);
  MPIDDP_EXPECT_ALL(t == mpiddp::topology_from_node_keys(r, allgather_keys(r / 2)));
}

TEST(Runtime, InjectedCyclicNodesMatchFormula) {
  // --distribution=cyclic over two nodes: rank r on node r % 2.
  const int r = runtime().rank(), n = runtime().size();
  mpiddp::Topology t = mpiddp::derive_topology(runtime().world(), r % 2);
  bool ok = t.node_rank == r % 2 && t.node_count == std::min(n, 2) && t.local_rank == r / 2 &&
            t.local_size == (n - r % 2 + 1) / 2;
  MPIDDP_EXPECT_ALL(ok);
  MPIDDP_EXPECT_ALL(t == mpiddp::topology_from_node_keys(r, allgather_keys(r % 2)));
}

TEST(Runtime, InjectedKeysNumberNodesByLowestRank) {
  // Descending keys: node numbering must still follow the lowest rank of each node.
  const int r = runtime().rank(), n = runtime().size();
  const int key = (n - 1 - r) / 3 + 10;
  mpiddp::Topology t = mpiddp::derive_topology(runtime().world(), key);
  MPIDDP_EXPECT_ALL(t == mpiddp::topology_from_node_keys(r, allgather_keys(key)));
}

TEST(Runtime, GatherStringsInRankOrder) {
  const int r = runtime().rank();
  // Rank 0 sends an empty string; the others strings of different lengths.
  const std::string mine =
      r == 0 ? std::string() : "rank" + std::to_string(r) + std::string(static_cast<size_t>(r * 7), 'x');
  auto expected = [](int q) {
    return q == 0 ? std::string() : "rank" + std::to_string(q) + std::string(static_cast<size_t>(q * 7), 'x');
  };
  auto all = mpiddp::allgather_strings(runtime().world(), mine);
  bool ok = static_cast<int>(all.size()) == runtime().size();
  for (int q = 0; ok && q < runtime().size(); ++q) ok = all[static_cast<size_t>(q)] == expected(q);
  MPIDDP_EXPECT_ALL(ok);

  const int root = runtime().size() - 1;
  auto at_root = mpiddp::gather_strings(runtime().world(), mine, root);
  ok = r == root ? at_root == all : at_root.empty();
  MPIDDP_EXPECT_ALL(ok);
}

TEST(Runtime, AllOkIsUnanimity) {
  EXPECT_TRUE(mpiddp::all_ok(runtime().world(), true));
  // One dissenting rank (the last) makes every rank see false.
  EXPECT_FALSE(mpiddp::all_ok(runtime().world(), runtime().rank() != runtime().size() - 1));
}

TEST(Runtime, MpiErrorBecomesMpiddpErrorWithMpiText) {
  // An invalid root is caught by MPI's argument checks on every rank, before any communication.
  int value = 0;
  bool threw = false;
  try {
    MPIDDP_CHECK_MPI(MPI_Bcast(&value, 1, MPI_INT, runtime().size() + 5, runtime().world()));
  } catch (const mpiddp::Error& e) {
    threw = e.rank() == runtime().rank() && e.message().find("MPI_Bcast") != std::string::npos &&
            e.message().find("MPI_ERR_ROOT") != std::string::npos;
    if (!threw) ADD_FAILURE() << e.what();
  }
  MPIDDP_EXPECT_ALL(threw);
}

TEST(Diagnostics, SanityChecksPass) {
  auto results = mpiddp::run_sanity_checks(runtime());
  bool ok = results.size() == 4;
  for (const auto& r : results) ok = ok && r.ok && r.ranks_ok == runtime().size() && r.failed_ranks.empty();
  MPIDDP_EXPECT_ALL(ok);
}

TEST(Diagnostics, FaultOnLastRankFailsEveryCheck) {
  // The last rank is also the broadcast root, so even the broadcast carries its bad value.
  auto results = mpiddp::run_sanity_checks(runtime(), runtime().size() - 1);
  bool ok = results.size() == 4;
  for (const auto& r : results)
    ok = ok && !r.ok && r.ranks_ok == 0 && static_cast<int>(r.failed_ranks.size()) == runtime().size();
  MPIDDP_EXPECT_ALL(ok);
}

TEST(Diagnostics, FaultOnRankZeroSparesOnlyTheBroadcastFromAnotherRoot) {
  auto results = mpiddp::run_sanity_checks(runtime(), 0);
  bool ok = results.size() == 4;
  for (const auto& r : results) {
    const bool broadcast = r.name.rfind("broadcast", 0) == 0;
    const bool expect_ok = broadcast && runtime().size() > 1;
    ok = ok && r.ok == expect_ok;
  }
  MPIDDP_EXPECT_ALL(ok);
}
