// Where a process sits in a multi-node run, from torchrun's or Slurm's environment and the flags.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "trainer/cluster.h"

namespace {

trainer::ClusterSpec resolve(const std::map<std::string, std::string>& env, trainer::ClusterOverrides o = {}) {
  return trainer::resolve_cluster(
      [&](const char* k) -> const char* {
        auto it = env.find(k);
        return it == env.end() ? nullptr : it->second.c_str();
      },
      o);
}

std::string error_of(const std::map<std::string, std::string>& env, trainer::ClusterOverrides o = {}) {
  try {
    resolve(env, o);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Cluster, SingleNodeWithoutALauncher) {
  auto c = resolve({});
  EXPECT_EQ(c.nnodes, 1);
  EXPECT_EQ(c.node_rank, 0);
  EXPECT_EQ(c.master_port, 29500);
}

TEST(Cluster, TorchrunOneProcessPerNode) {
  auto c = resolve({{"WORLD_SIZE", "4"}, {"RANK", "2"}, {"LOCAL_WORLD_SIZE", "1"}, {"MASTER_ADDR", "n0"},
                    {"MASTER_PORT", "1234"}});
  EXPECT_EQ(c.nnodes, 4);
  EXPECT_EQ(c.node_rank, 2);
  EXPECT_EQ(c.master_addr, "n0");
  EXPECT_EQ(c.master_port, 1234);
  EXPECT_EQ(resolve({{"WORLD_SIZE", "2"}, {"NODE_RANK", "1"}, {"RANK", "0"}}).node_rank, 1);  // NODE_RANK first
  EXPECT_NE(error_of({{"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", "4"}}).find("--nproc-per-node=1"), std::string::npos);
}

TEST(Cluster, SlurmNodesAndTheFirstHost) {
  auto c = resolve({{"SLURM_NNODES", "3"}, {"SLURM_NODEID", "1"}, {"SLURM_PROCID", "7"},
                    {"SLURM_JOB_NODELIST", "gpu[07-09,12],login1"}});
  EXPECT_EQ(c.nnodes, 3);
  EXPECT_EQ(c.node_rank, 1);
  EXPECT_EQ(c.master_addr, "gpu07");
  EXPECT_EQ(c.source, "Slurm");
  EXPECT_EQ(trainer::first_slurm_host("a,b"), "a");
  EXPECT_EQ(trainer::first_slurm_host("node[3,5]"), "node3");
  EXPECT_EQ(trainer::first_slurm_host("single"), "single");
}

TEST(Cluster, FlagsOverrideAndBadValuesAreNamed) {
  trainer::ClusterOverrides o;
  o.nnodes = 2;
  o.node_rank = 1;
  o.master_port = 4000;
  auto c = resolve({{"SLURM_NNODES", "3"}, {"SLURM_NODEID", "2"}}, o);
  EXPECT_EQ(c.nnodes, 2);
  EXPECT_EQ(c.node_rank, 1);
  EXPECT_EQ(c.master_port, 4000);
  EXPECT_EQ(c.source, "Slurm and command line");
  EXPECT_NE(error_of({{"WORLD_SIZE", "two"}}).find("WORLD_SIZE: expected an integer"), std::string::npos);
  EXPECT_NE(error_of({{"WORLD_SIZE", "2"}, {"RANK", "2"}}).find("--node-rank: 2 is not below the node count 2"),
            std::string::npos);
  EXPECT_NE(error_of({{"MASTER_PORT", "70000"}}).find("--master-port"), std::string::npos);
}
