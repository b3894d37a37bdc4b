#include "kernels/gdr_head_sizes.h"

#include <atomic>

namespace kernels {

namespace {
std::atomic<bool> g_fixed_head_sizes{true};
std::atomic<int64_t> g_fixed_head_size_launches{0};
}  // namespace

void gdr_fixed_head_sizes(bool on) { g_fixed_head_sizes = on; }
bool gdr_fixed_head_sizes() { return g_fixed_head_sizes.load(); }
int64_t gdr_fixed_head_size_launches() { return g_fixed_head_size_launches.load(); }
void gdr_count_fixed_head_size_launch() { ++g_fixed_head_size_launches; }

}  // namespace kernels
