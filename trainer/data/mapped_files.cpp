// A fixed table of slots, written with atomics and read by the signal handler without locks or
// allocation: the handler may run on any thread, at any instant, even inside malloc.
#include "trainer/data/mapped_files.h"

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>

namespace trainer::data {
namespace {

constexpr int kSlots = 4096;      // corpus files a run names in its reports (more are mapped unnamed)
constexpr size_t kPathBytes = 512;  // a longer path is reported by its last bytes

struct Slot {
  std::atomic<bool> taken{false};
  std::atomic<uintptr_t> begin{0}, end{0};  // [begin, end); begin = 0 while the slot is not readable
  char path[kPathBytes] = {};
};
Slot g_slots[kSlots];

void write_all(int fd, const char* s, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}
void write_text(int fd, const char* s) { write_all(fd, s, std::strlen(s)); }
void write_number(int fd, uint64_t v) {
  char buf[24];
  int i = sizeof buf;
  do {
    buf[--i] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v > 0);
  write_all(fd, buf + i, sizeof buf - static_cast<size_t>(i));
}

}  // namespace

int remember_mapping(const void* data, size_t size, const std::string& path) {
  if (data == nullptr || size == 0) return -1;
  for (int i = 0; i < kSlots; ++i) {
    bool free = false;
    if (!g_slots[i].taken.compare_exchange_strong(free, true)) continue;
    Slot& s = g_slots[i];
    const size_t skip = path.size() >= kPathBytes ? path.size() - (kPathBytes - 1) : 0;
    std::memcpy(s.path, path.data() + skip, path.size() - skip);
    s.path[path.size() - skip] = '\0';
    const auto b = reinterpret_cast<uintptr_t>(data);
    s.end.store(b + size, std::memory_order_relaxed);
    s.begin.store(b, std::memory_order_release);  // readable from here on
    return i;
  }
  return -1;
}

void forget_mapping(int handle) {
  if (handle < 0 || handle >= kSlots) return;
  Slot& s = g_slots[handle];
  s.begin.store(0, std::memory_order_release);
  s.end.store(0, std::memory_order_relaxed);
  s.taken.store(false, std::memory_order_release);
}

bool report_mapped_fault(const void* addr, int fd) {
  const auto a = reinterpret_cast<uintptr_t>(addr);
  for (const Slot& s : g_slots) {
    const uintptr_t b = s.begin.load(std::memory_order_acquire);
    if (b == 0 || a < b || a >= s.end.load(std::memory_order_relaxed)) continue;
    write_text(fd, "\ndeltadeck: bus error reading ");
    write_text(fd, s.path);
    write_text(fd, " at byte ");
    write_number(fd, a - b);
    write_text(fd, ": the file is shorter than when the run opened it (truncated or replaced while training, or "
                   "its disk failed). The run ends here; its last committed checkpoint is kept, and a resume "
                   "reads the file again.\n");
    return true;
  }
  return false;
}

}  // namespace trainer::data
