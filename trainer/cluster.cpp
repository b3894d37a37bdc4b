#include "trainer/cluster.h"

#include <stdexcept>

namespace trainer {

namespace {

int parse_int(const std::string& text, const std::string& name, int min) {
  size_t used = 0;
  int v = 0;
  try {
    v = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || v < min)
    throw std::runtime_error(name + ": expected an integer >= " + std::to_string(min) + " (got \"" + text + "\")");
  return v;
}

}  // namespace

std::string nccl_error_handling_override(const EnvLookup& env) {
  const char* mode = env("TORCH_NCCL_ASYNC_ERROR_HANDLING");
  if (mode == nullptr) return "2";
  const bool torchrun_default = env("TORCHELASTIC_RUN_ID") != nullptr && std::string(mode) == "1";
  return torchrun_default ? "2" : "";
}

std::string first_slurm_host(const std::string& nodelist) {
  // The first entry ends at a comma outside brackets.
  int depth = 0;
  size_t end = nodelist.size();
  for (size_t i = 0; i < nodelist.size(); ++i) {
    if (nodelist[i] == '[') ++depth;
    if (nodelist[i] == ']') --depth;
    if (nodelist[i] == ',' && depth == 0) {
      end = i;
      break;
    }
  }
  const std::string first = nodelist.substr(0, end);
  const size_t open = first.find('[');
  if (open == std::string::npos) return first;
  // prefix[01-04,07] -> prefix + the first number of the range, keeping its zero padding.
  std::string inside = first.substr(open + 1, first.find(']') - open - 1);
  const size_t stop = inside.find_first_of("-,");
  return first.substr(0, open) + inside.substr(0, stop);
}

ClusterSpec resolve_cluster(const EnvLookup& env, const ClusterOverrides& o) {
  ClusterSpec c;
  auto get = [&](const char* k) -> std::string {
    const char* v = env(k);
    return v ? std::string(v) : std::string();
  };
  bool addr_given = false;
  if (!get("SLURM_NNODES").empty() && get("WORLD_SIZE").empty()) {
    // Inside an srun step its own node count and node list: a step may run on part of the job's
    // allocation (srun -N2 -w node[03-04] in a 4-node job), where node 0 is the step's first node.
    const std::string nodes = !get("SLURM_STEP_NUM_NODES").empty() ? "SLURM_STEP_NUM_NODES" : "SLURM_NNODES";
    c.nnodes = parse_int(get(nodes.c_str()), nodes, 1);
    const std::string node = !get("SLURM_NODEID").empty() ? "SLURM_NODEID" : "SLURM_PROCID";
    if (!get(node.c_str()).empty()) c.node_rank = parse_int(get(node.c_str()), node, 0);
    const std::string list = !get("SLURM_STEP_NODELIST").empty() ? "SLURM_STEP_NODELIST" : "SLURM_JOB_NODELIST";
    if (!get(list.c_str()).empty()) {
      c.master_addr = first_slurm_host(get(list.c_str()));
      addr_given = true;
    }
    // One deltadeck process a node: several tasks on a node would share its node rank.
    if (!get("SLURM_STEP_NUM_TASKS").empty()) {
      const int tasks = parse_int(get("SLURM_STEP_NUM_TASKS"), "SLURM_STEP_NUM_TASKS", 1);
      if (tasks != c.nnodes)
        throw std::runtime_error("SLURM_STEP_NUM_TASKS: deltadeck runs one process per node with a rank per GPU "
                                 "inside it; start it with srun --ntasks-per-node=1 (got " + std::to_string(tasks) +
                                 " tasks on " + std::to_string(c.nnodes) + " nodes)");
    }
    c.source = "Slurm";
  } else if (!get("WORLD_SIZE").empty()) {
    // torchrun with --nproc-per-node=1 (one deltadeck process per node): WORLD_SIZE counts nodes.
    const int procs = parse_int(get("WORLD_SIZE"), "WORLD_SIZE", 1);
    const int per_node = get("LOCAL_WORLD_SIZE").empty() ? 1 : parse_int(get("LOCAL_WORLD_SIZE"), "LOCAL_WORLD_SIZE", 1);
    if (per_node != 1)
      throw std::runtime_error("LOCAL_WORLD_SIZE: deltadeck runs one process per node with a rank per GPU inside "
                               "it; launch with --nproc-per-node=1 (got " + std::to_string(per_node) + ")");
    c.nnodes = procs;
    const std::string node = !get("NODE_RANK").empty() ? "NODE_RANK" : "RANK";
    if (!get(node.c_str()).empty()) c.node_rank = parse_int(get(node.c_str()), node, 0);
    c.source = "torchrun environment";
    const std::string agent = get("TORCHELASTIC_USE_AGENT_STORE");
    c.agent_store = agent == "True" || agent == "true" || agent == "1";
    if (c.agent_store && !get("TORCHELASTIC_RESTART_COUNT").empty())
      c.restart_count = parse_int(get("TORCHELASTIC_RESTART_COUNT"), "TORCHELASTIC_RESTART_COUNT", 0);
  }
  if (!get("MASTER_ADDR").empty()) {
    c.master_addr = get("MASTER_ADDR");
    addr_given = true;
  }
  if (!get("MASTER_PORT").empty()) c.master_port = parse_int(get("MASTER_PORT"), "MASTER_PORT", 1);
  bool flags = false;
  if (o.nnodes >= 0) c.nnodes = o.nnodes, flags = true;
  if (o.node_rank >= 0) c.node_rank = o.node_rank, flags = true;
  if (!o.master_addr.empty()) c.master_addr = o.master_addr, flags = true, addr_given = true;
  if (o.master_port >= 0) c.master_port = o.master_port, flags = true;
  if (flags) c.source = c.source == "single node" ? "command line" : c.source + " and command line";
  if (c.nnodes < 1) throw std::runtime_error("--nnodes: must be >= 1 (got " + std::to_string(c.nnodes) + ")");
  if (c.node_rank >= c.nnodes)
    throw std::runtime_error("--node-rank: " + std::to_string(c.node_rank) + " is not below the node count " +
                             std::to_string(c.nnodes) + " (" + c.source + ")");
  // Node 0 serves the rendezvous; the others must be told where. Without an address they would
  // look for it on this machine (127.0.0.1) for the whole collective timeout.
  if (c.nnodes > 1 && c.node_rank > 0 && !addr_given)
    throw std::runtime_error("--master-addr: node " + std::to_string(c.node_rank) + " of " +
                             std::to_string(c.nnodes) + " needs node 0's host (--master-addr or MASTER_ADDR; " +
                             c.source + ")");
  if (c.master_port < 1 || c.master_port > 65535)
    throw std::runtime_error("--master-port: must be 1..65535 (got " + std::to_string(c.master_port) + ")");
  return c;
}

}  // namespace trainer
