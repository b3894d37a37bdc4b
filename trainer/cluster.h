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
// "" to leave it as it is. torchrun's agent (TORCHELASTIC_RUN_ID) exports 1 unless the variable was
// set: NCCL's watchdog then ends the process with SIGABRT when a peer fails, before node 0 can record
// the run as failed. deltadeck takes 3 there, PyTorch's own default: the communicators are aborted and
// the waiting collective throws, so the run ends recorded as failed, with its cause.
std::string nccl_error_handling_override(const EnvLookup& env);

// The first host of a Slurm node list: "gpu[01-04,07],cpu5" -> "gpu01"; "a,b" -> "a".
std::string first_slurm_host(const std::string& nodelist);

}  // namespace trainer
