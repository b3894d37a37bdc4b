// Where the ranks of a run meet before their process groups form: a c10d store (a TCPStore across
// nodes, an in-process HashStore for ranks that are threads of one process). Kept apart from
// trainer/comm.h so that the app can meet the other nodes without ATen's headers.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace trainer {

// Where ranks meet (a c10d store). Shared by the ranks' threads.
class Rendezvous {
 public:
  // One process, ranks as threads.
  static std::shared_ptr<Rendezvous> in_process();
  // Several processes (one per node): a c10d TCPStore served by node 0 at addr:port (`serve`); the
  // others connect, retrying until `timeout`. A non-empty `prefix` puts every key under it (a store
  // that a launcher serves and keeps across restarts). Throws std::runtime_error naming addr:port.
  static std::shared_ptr<Rendezvous> tcp(const std::string& addr, int port, bool serve, int nodes,
                                         std::chrono::milliseconds timeout, const std::string& prefix = "");
  // Publishes this node's value under `key` and returns every node's, in node order (waits for
  // them). For agreeing on the layout before the process groups form.
  std::vector<std::string> exchange(const std::string& key, int node, int nodes, const std::string& value,
                                    std::chrono::milliseconds timeout);
  // exchange's halves: publishes this node's value under `key` without waiting; waits for one
  // node's value under `key` (throws std::runtime_error past `timeout`). For one node telling the
  // others, where an exchange would have the teller wait for values nobody needs.
  void publish(const std::string& key, int node, const std::string& value);
  std::string value_of(const std::string& key, int node, std::chrono::milliseconds timeout);
  virtual ~Rendezvous() = default;
  struct Impl;
  std::shared_ptr<Impl> impl;
};

}  // namespace trainer
