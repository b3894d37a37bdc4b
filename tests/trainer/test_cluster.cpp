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
  EXPECT_EQ(resolve({{"WORLD_SIZE", "2"}, {"NODE_RANK", "1"}, {"RANK", "0"}, {"MASTER_ADDR", "n0"}}).node_rank,
            1);  // NODE_RANK first
  EXPECT_NE(error_of({{"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", "4"}}).find("--nproc-per-node=1"), std::string::npos);
}

// An srun step on part of the allocation: its own nodes and first host, not the job's; several
// tasks a node are refused (they would share a node rank).
TEST(Cluster, SlurmStepOnPartOfTheAllocation) {
  auto c = resolve({{"SLURM_NNODES", "4"}, {"SLURM_STEP_NUM_NODES", "2"}, {"SLURM_NODEID", "1"},
                    {"SLURM_JOB_NODELIST", "node[01-04]"}, {"SLURM_STEP_NODELIST", "node[03-04]"},
                    {"SLURM_STEP_NUM_TASKS", "2"}});
  EXPECT_EQ(c.nnodes, 2);
  EXPECT_EQ(c.node_rank, 1);
  EXPECT_EQ(c.master_addr, "node03");
  const std::string err = error_of({{"SLURM_NNODES", "2"}, {"SLURM_NODEID", "0"}, {"SLURM_JOB_NODELIST", "n[1-2]"},
                                    {"SLURM_STEP_NUM_TASKS", "16"}});
  EXPECT_NE(err.find("--ntasks-per-node=1"), std::string::npos) << err;
  EXPECT_NE(err.find("16 tasks on 2 nodes"), std::string::npos) << err;
}

// A node other than 0 with no address for node 0 would wait on 127.0.0.1 for the whole timeout.
TEST(Cluster, OtherNodesNeedNodeZerosAddress) {
  trainer::ClusterOverrides o;
  o.nnodes = 2;
  o.node_rank = 1;
  const std::string err = error_of({}, o);
  EXPECT_NE(err.find("--master-addr: node 1 of 2 needs node 0's host"), std::string::npos) << err;
  o.master_addr = "10.0.0.1";
  EXPECT_EQ(resolve({}, o).master_addr, "10.0.0.1");
  o.master_addr.clear();
  EXPECT_EQ(resolve({{"MASTER_ADDR", "n0"}}, o).master_addr, "n0");
  o.node_rank = 0;
  EXPECT_EQ(resolve({}, o).master_addr, "127.0.0.1");  // node 0 serves: no address needed
}

// torchrun's static rendezvous serves a TCPStore in node 0's agent and says so to the workers:
// deltadeck then connects to it (node 0 too) rather than failing to serve the same port.
TEST(Cluster, TorchrunAgentStore) {
  auto c = resolve({{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"MASTER_ADDR", "n0"}, {"MASTER_PORT", "29400"},
                    {"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"TORCHELASTIC_RESTART_COUNT", "3"}});
  EXPECT_TRUE(c.agent_store);
  EXPECT_EQ(c.restart_count, 3);
  EXPECT_FALSE(resolve({{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"TORCHELASTIC_USE_AGENT_STORE", "False"}}).agent_store);
  EXPECT_FALSE(resolve({{"WORLD_SIZE", "2"}, {"RANK", "0"}}).agent_store);
}

// NCCL's error handling becomes 2 (abort the communicators and throw, no teardown) where it is
// unset (PyTorch's default 3 tears the process down) and where torchrun's agent exported its 1; a
// value the user set is left alone.
TEST(Cluster, NcclErrorsThrowInsteadOfEndingTheProcess) {
  auto override_for = [](const std::map<std::string, std::string>& env) {
    return trainer::nccl_error_handling_override([&](const char* k) -> const char* {
      auto it = env.find(k);
      return it == env.end() ? nullptr : it->second.c_str();
    });
  };
  EXPECT_EQ(override_for({}), "2");
  EXPECT_EQ(override_for({{"TORCHELASTIC_RUN_ID", "none"}}), "2");
  EXPECT_EQ(override_for({{"TORCHELASTIC_RUN_ID", "none"}, {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"}}), "2");
  EXPECT_EQ(override_for({{"TORCHELASTIC_RUN_ID", "none"}, {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"}}), "");
  EXPECT_EQ(override_for({{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"}}), "");
  EXPECT_EQ(override_for({{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"}}), "");
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
  auto c = resolve({{"SLURM_NNODES", "3"}, {"SLURM_NODEID", "2"}, {"SLURM_JOB_NODELIST", "gpu[01-03]"}}, o);
  EXPECT_EQ(c.nnodes, 2);
  EXPECT_EQ(c.node_rank, 1);
  EXPECT_EQ(c.master_port, 4000);
  EXPECT_EQ(c.source, "Slurm and command line");
  EXPECT_NE(error_of({{"WORLD_SIZE", "two"}}).find("WORLD_SIZE: expected an integer"), std::string::npos);
  EXPECT_NE(error_of({{"WORLD_SIZE", "2"}, {"RANK", "2"}}).find("--node-rank: 2 is not below the node count 2"),
            std::string::npos);
  EXPECT_NE(error_of({{"MASTER_PORT", "70000"}}).find("--master-port"), std::string::npos);
}
