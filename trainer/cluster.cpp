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
  if (!get("SLURM_NNODES").empty() && get("WORLD_SIZE").empty()) {
    c.nnodes = parse_int(get("SLURM_NNODES"), "SLURM_NNODES", 1);
    const std::string node = !get("SLURM_NODEID").empty() ? "SLURM_NODEID" : "SLURM_PROCID";
    if (!get(node.c_str()).empty()) c.node_rank = parse_int(get(node.c_str()), node, 0);
    if (!get("SLURM_JOB_NODELIST").empty()) c.master_addr = first_slurm_host(get("SLURM_JOB_NODELIST"));
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
  }
  if (!get("MASTER_ADDR").empty()) c.master_addr = get("MASTER_ADDR");
  if (!get("MASTER_PORT").empty()) c.master_port = parse_int(get("MASTER_PORT"), "MASTER_PORT", 1);
  bool flags = false;
  if (o.nnodes >= 0) c.nnodes = o.nnodes, flags = true;
  if (o.node_rank >= 0) c.node_rank = o.node_rank, flags = true;
  if (!o.master_addr.empty()) c.master_addr = o.master_addr, flags = true;
  if (o.master_port >= 0) c.master_port = o.master_port, flags = true;
  if (flags) c.source = c.source == "single node" ? "command line" : c.source + " and command line";
  if (c.nnodes < 1) throw std::runtime_error("--nnodes: must be >= 1 (got " + std::to_string(c.nnodes) + ")");
  if (c.node_rank >= c.nnodes)
    throw std::runtime_error("--node-rank: " + std::to_string(c.node_rank) + " is not below the node count " +
                             std::to_string(c.nnodes) + " (" + c.source + ")");
  if (c.master_port < 1 || c.master_port > 65535)
    throw std::runtime_error("--master-port: must be 1..65535 (got " + std::to_string(c.master_port) + ")");
  return c;
}

}  // namespace trainer
