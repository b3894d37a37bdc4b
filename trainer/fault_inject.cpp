#include "trainer/fault_inject.h"

#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace trainer {
namespace {

struct Fault {
  std::string action, point;
  int rank = -1;       // -1: any
  int64_t step = -1;   // -1: any
};

const char* const PROCESS_ACTIONS[] = {"throw", "crash", "hang", "sigterm", "sigint", "sighup", "sigterm2"};
const char* const DATA_ACTIONS[] = {"nan", "inf", "spike"};

bool is_one_of(const std::string& a, const char* const* list, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (a == list[i]) return true;
  return false;
}

Fault parse_one(const std::string& s) {
  Fault f;
  const auto at = s.find('@');
  if (at == std::string::npos) throw std::invalid_argument("DELTADECK_FAULT: expected action@point, got \"" + s + "\"");
  f.action = s.substr(0, at);
  std::stringstream rest(s.substr(at + 1));
  std::getline(rest, f.point, ',');
  for (std::string kv; std::getline(rest, kv, ',');) {
    if (kv.rfind("rank=", 0) == 0) {
      f.rank = std::stoi(kv.substr(5));
    } else if (kv.rfind("step=", 0) == 0) {
      f.step = std::stoll(kv.substr(5));
    } else {
      throw std::invalid_argument("DELTADECK_FAULT: unknown field \"" + kv + "\" (rank=, step=)");
    }
  }
  if (!is_one_of(f.action, PROCESS_ACTIONS, std::size(PROCESS_ACTIONS)) &&
      !is_one_of(f.action, DATA_ACTIONS, std::size(DATA_ACTIONS)))
    throw std::invalid_argument("DELTADECK_FAULT: unknown action \"" + f.action +
                                "\" (throw, crash, hang, sigterm, sigint, sighup, sigterm2, nan, inf, spike)");
  return f;
}

std::vector<Fault> parse(const std::string& text) {
  std::vector<Fault> out;
  std::stringstream all(text);
  for (std::string one; std::getline(all, one, ';');)
    if (!one.empty()) out.push_back(parse_one(one));
  return out;
}

// Read at every point (tests arm it between runs of one process); parsed again only when it changed.
std::shared_ptr<const std::vector<Fault>> armed() {
  static std::mutex mu;
  static std::string seen;
  static std::shared_ptr<const std::vector<Fault>> faults = std::make_shared<std::vector<Fault>>();
  const char* env = std::getenv("DELTADECK_FAULT");
  const std::string now = env ? env : "";
  std::lock_guard<std::mutex> lk(mu);
  if (now != seen) {
    faults = std::make_shared<const std::vector<Fault>>(parse(now));
    seen = now;
  }
  return faults;
}

bool matches(const Fault& f, const char* point, int rank, int64_t step) {
  return f.point == point && (f.rank < 0 || f.rank == rank) && (f.step < 0 || f.step == step);
}

}  // namespace

void fault_point(const char* point, int rank, int64_t step) {
  if (!std::getenv("DELTADECK_FAULT")) return;
  for (const Fault& f : *armed()) {
    if (!matches(f, point, rank, step) || !is_one_of(f.action, PROCESS_ACTIONS, std::size(PROCESS_ACTIONS))) continue;
    const std::string where = std::string("injected fault at ") + point + " (rank " + std::to_string(rank) +
                              ", step " + std::to_string(step) + ")";
    if (f.action == "throw") throw std::runtime_error(where);
    if (f.action == "crash") std::_Exit(137);
    if (f.action == "sigterm") {
      ::raise(SIGTERM);
    } else if (f.action == "sigint") {
      ::raise(SIGINT);
    } else if (f.action == "sighup") {
      ::raise(SIGHUP);
    } else if (f.action == "sigterm2") {
      ::raise(SIGTERM);
      ::raise(SIGTERM);
    } else {
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));  // hang
    }
  }
}

bool fault_fires(const char* action, const char* point, int rank, int64_t step) {
  if (!std::getenv("DELTADECK_FAULT")) return false;
  for (const Fault& f : *armed())
    if (f.action == action && matches(f, point, rank, step)) return true;
  return false;
}

}  // namespace trainer
