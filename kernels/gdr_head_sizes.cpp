#include "kernels/gdr_head_sizes.h"

#include <atomic>

namespace kernels {

namespace {
std::atomic<bool> g_fixed_head_sizes{true};
std::atomic<int64_t> g_launches[static_cast<int>(GdrSizedKernel::kCount)] = {};
std::atomic<bool> g_copies16{true};
std::atomic<int64_t> g_copies16_launches{0};
std::atomic<bool> g_fast_decay{true};
std::atomic<int64_t> g_exact_decay_launches{0};
}  // namespace

void gdr_fixed_head_sizes(bool on) { g_fixed_head_sizes = on; }
bool gdr_fixed_head_sizes() { return g_fixed_head_sizes.load(); }
int64_t gdr_fixed_head_size_launches(GdrSizedKernel kernel) { return g_launches[static_cast<int>(kernel)].load(); }
void gdr_count_fixed_head_size_launch(GdrSizedKernel kernel) { ++g_launches[static_cast<int>(kernel)]; }
void gdr_chunk_copies16(bool on) { g_copies16 = on; }
bool gdr_chunk_copies16() { return g_copies16.load(); }
int64_t gdr_chunk_copies16_launches() { return g_copies16_launches.load(); }
void gdr_count_chunk_copies16_launch() { ++g_copies16_launches; }
void gdr_chunk_fast_decay(bool on) { g_fast_decay = on; }
bool gdr_chunk_fast_decay() { return g_fast_decay.load(); }
int64_t gdr_chunk_exact_decay_launches() { return g_exact_decay_launches.load(); }
void gdr_count_chunk_exact_decay_launch() { ++g_exact_decay_launches; }

}  // namespace kernels
