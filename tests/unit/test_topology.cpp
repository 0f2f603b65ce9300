// The node/local-rank rule as a pure function, checked against closed-form expectations for
// ranks spread over several nodes in block, cyclic and irregular layouts.
#include <mpiddp/error.hpp>
#include <mpiddp/runtime.hpp>

#include <gtest/gtest.h>

#include <map>
#include <string>

using mpiddp::Topology;
using mpiddp::topology_from_node_keys;

TEST(Topology, SingleNodeLocalRankIsWorldRank) {
  std::vector<long> keys(4, 42);
  for (int r = 0; r < 4; ++r) {
    Topology t = topology_from_node_keys(r, keys);
    EXPECT_EQ(t.rank, r);
    EXPECT_EQ(t.size, 4);
    EXPECT_EQ(t.local_rank, r);
    EXPECT_EQ(t.local_size, 4);
    EXPECT_EQ(t.node_rank, 0);
    EXPECT_EQ(t.node_count, 1);
  }
}

TEST(Topology, BlockLayoutMatchesFormula) {
  // 7 ranks, 3 per node (like --ntasks-per-node=3): the last node is short.
  const int size = 7, per_node = 3;
  std::vector<long> keys;
  for (int r = 0; r < size; ++r) keys.push_back(1000 + r / per_node);
  for (int r = 0; r < size; ++r) {
    Topology t = topology_from_node_keys(r, keys);
    EXPECT_EQ(t.node_rank, r / per_node);
    EXPECT_EQ(t.node_count, (size + per_node - 1) / per_node);
    EXPECT_EQ(t.local_rank, r % per_node);
    EXPECT_EQ(t.local_size, std::min(per_node, size - (r / per_node) * per_node));
  }
}

TEST(Topology, CyclicLayoutMatchesFormula) {
  // --distribution=cyclic over 3 nodes: rank r on node r % 3.
  const int size = 8, nodes = 3;
  std::vector<long> keys;
  for (int r = 0; r < size; ++r) keys.push_back(r % nodes);
  for (int r = 0; r < size; ++r) {
    Topology t = topology_from_node_keys(r, keys);
    EXPECT_EQ(t.node_rank, r % nodes);
    EXPECT_EQ(t.node_count, nodes);
    EXPECT_EQ(t.local_rank, r / nodes);
    EXPECT_EQ(t.local_size, (size - r % nodes + nodes - 1) / nodes);
  }
}

TEST(Topology, NodesNumberedByLowestRankNotByKey) {
  // Keys descending: node numbering must follow rank order, not key order.
  std::vector<long> keys = {9, 9, 5, 7, 5};
  EXPECT_EQ(topology_from_node_keys(0, keys).node_rank, 0);
  EXPECT_EQ(topology_from_node_keys(2, keys).node_rank, 1);
  EXPECT_EQ(topology_from_node_keys(3, keys).node_rank, 2);
  EXPECT_EQ(topology_from_node_keys(4, keys).node_rank, 1);
  EXPECT_EQ(topology_from_node_keys(4, keys).local_rank, 1);
  EXPECT_EQ(topology_from_node_keys(3, keys).local_size, 1);
}

TEST(Topology, EveryRankItsOwnNode) {
  std::vector<long> keys = {3, 1, 4, 0};
  for (int r = 0; r < 4; ++r) {
    Topology t = topology_from_node_keys(r, keys);
    EXPECT_EQ(t.node_rank, r);
    EXPECT_EQ(t.local_rank, 0);
    EXPECT_EQ(t.local_size, 1);
    EXPECT_EQ(t.node_count, 4);
  }
}

TEST(Topology, RankOutsideWorldThrows) {
  std::vector<long> keys = {0, 0};
  EXPECT_THROW(topology_from_node_keys(2, keys), mpiddp::Error);
  EXPECT_THROW(topology_from_node_keys(-1, keys), mpiddp::Error);
}

TEST(Device, RoundRobinOverVisibleGpus) {
  EXPECT_TRUE(mpiddp::choose_device(0, 0).is_cpu());
  EXPECT_TRUE(mpiddp::choose_device(5, 0).is_cpu());
  EXPECT_EQ(mpiddp::choose_device(0, 4).str(), "cuda:0");
  EXPECT_EQ(mpiddp::choose_device(3, 4).str(), "cuda:3");
  EXPECT_EQ(mpiddp::choose_device(5, 4).str(), "cuda:1");
  EXPECT_EQ(mpiddp::choose_device(2, 1).str(), "cuda:0");
  EXPECT_THROW(mpiddp::choose_device(-1, 2), mpiddp::Error);
}

namespace {
// A fake environment for launcher_world_size.
std::function<const char*(const char*)> env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}
}  // namespace

TEST(LauncherSize, NoneWithoutLauncher) { EXPECT_FALSE(mpiddp::launcher_world_size(env({})).has_value()); }

TEST(LauncherSize, SlurmNtasks) {
  auto s = mpiddp::launcher_world_size(env({{"SLURM_NTASKS", "4"}}));
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->variable, "SLURM_NTASKS");
  EXPECT_EQ(s->size, 4);
}

TEST(LauncherSize, MostSpecificWins) {
  // mpirun -np 1 inside an sbatch allocation of 4 tasks is a deliberate world of 1.
  auto s = mpiddp::launcher_world_size(env({{"SLURM_NTASKS", "4"}, {"OMPI_COMM_WORLD_SIZE", "1"}}));
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->variable, "OMPI_COMM_WORLD_SIZE");
  EXPECT_EQ(s->size, 1);
  s = mpiddp::launcher_world_size(env({{"SLURM_NTASKS", "8"}, {"SLURM_STEP_NUM_TASKS", "2"}}));
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->size, 2);
}

TEST(LauncherSize, NonNumbersIgnored) {
  EXPECT_FALSE(mpiddp::launcher_world_size(env({{"SLURM_NTASKS", "four"}})).has_value());
  EXPECT_FALSE(mpiddp::launcher_world_size(env({{"SLURM_NTASKS", "4x"}})).has_value());
  EXPECT_FALSE(mpiddp::launcher_world_size(env({{"SLURM_NTASKS", "-3"}})).has_value());
  auto s = mpiddp::launcher_world_size(env({{"PMI_SIZE", ""}, {"SLURM_NTASKS", "3"}}));
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->size, 3);
}

TEST(ThreadLevel, Names) {
  EXPECT_EQ(mpiddp::thread_level_name(MPI_THREAD_MULTIPLE), "MPI_THREAD_MULTIPLE");
  EXPECT_EQ(mpiddp::thread_level_name(MPI_THREAD_SINGLE), "MPI_THREAD_SINGLE");
  EXPECT_NE(mpiddp::thread_level_name(12345).find("unknown"), std::string::npos);
}
