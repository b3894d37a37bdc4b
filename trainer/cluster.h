// Where this process sits in a multi-node run: one deltadeck process per node, one rank per local
// device. Read from the launcher's environment — torchrun's NODE_RANK/RANK, WORLD_SIZE (processes),
// MASTER_ADDR, MASTER_PORT, or Slurm's SLURM_NNODES, SLURM_NODEID/SLURM_PROCID and the first host of
// SLURM_JOB_NODELIST — and overridable by the command line. Torch-free.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace trainer {

struct ClusterSpec {
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source = "single node";  // where the values came from, for the start line
  // torchrun's agent already serves a TCPStore at master_addr:master_port
  // (TORCHELASTIC_USE_AGENT_STORE): every node, node 0 too, connects to it as a client, under a
  // key prefix of this attempt (TORCHELASTIC_RESTART_COUNT), so a restarted job never reads the
  // keys of the attempt before it.
  bool agent_store = false;
  int restart_count = 0;
};

// Command-line overrides; a negative number or empty text means "not given".
struct ClusterOverrides {
  int nnodes = -1;
  int node_rank = -1;
  std::string master_addr;
  int master_port = -1;
};

// getenv-like lookup: the value, or nullptr when unset.
using EnvLookup = std::function<const char*(const char*)>;

// Resolves the spec. Throws std::runtime_error naming the variable or flag on a malformed value or
// an inconsistent one (node rank >= node count). Any thread.
ClusterSpec resolve_cluster(const EnvLookup& env, const ClusterOverrides& overrides);

// The TORCH_NCCL_ASYNC_ERROR_HANDLING this process should take before any process group exists, or
// "" to leave it as it is. deltadeck wants 2 (CleanUpOnly): when a peer fails or a collective times
// out, NCCL's watchdog aborts the communicators and the waiting collective throws, so the run ends
// recorded as failed, with its cause, and its last checkpoint. PyTorch's default when the variable
// is unset, 3 (SkipCleanUp), and the 1 (TearDown) torchrun's agent (TORCHELASTIC_RUN_ID) exports
// unless the variable was set, both end the process from the watchdog (SIGABRT) before node 0 can
// record anything. A value the user set outside torchrun is kept.
std::string nccl_error_handling_override(const EnvLookup& env);

// The first host of a Slurm node list: "gpu[01-04,07],cpu5" -> "gpu01"; "a,b" -> "a".
std::string first_slurm_host(const std::string& nodelist);

}  // namespace trainer
