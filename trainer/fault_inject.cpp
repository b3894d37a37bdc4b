#include "trainer/fault_inject.h"

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

namespace trainer {
namespace {

struct Fault {
  std::string action, point;
  int rank = -1;       // -1: any
  int64_t step = -1;   // -1: any
};

std::optional<Fault> parse(const char* text) {
  Fault f;
  std::string s(text);
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
  if (f.action != "throw" && f.action != "crash" && f.action != "hang")
    throw std::invalid_argument("DELTADECK_FAULT: unknown action \"" + f.action + "\" (throw, crash, hang)");
  return f;
}

// Read at every point (tests arm it between runs of one process); parsed again only when it changed.
std::optional<Fault> armed() {
  static std::mutex mu;
  static std::string seen;
  static std::optional<Fault> fault;
  const char* env = std::getenv("DELTADECK_FAULT");
  const std::string now = env ? env : "";
  std::lock_guard<std::mutex> lk(mu);
  if (now != seen) {
    fault = now.empty() ? std::optional<Fault>{} : parse(now.c_str());
    seen = now;
  }
  return fault;
}

}  // namespace

void fault_point(const char* point, int rank, int64_t step) {
  const auto f = armed();
  if (!f || f->point != point || (f->rank >= 0 && f->rank != rank) || (f->step >= 0 && f->step != step)) return;
  const std::string where = std::string("injected fault at ") + point + " (rank " + std::to_string(rank) +
                            ", step " + std::to_string(step) + ")";
  if (f->action == "throw") throw std::runtime_error(where);
  if (f->action == "crash") std::_Exit(137);
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));  // hang
}

}  // namespace trainer
