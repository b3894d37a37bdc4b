#include "trainer/fp8_checkpoint.h"

#include <torch/torch.h>

#include <cstring>
#include <map>
#include <stdexcept>

namespace trainer {

namespace {

constexpr const char* kRank0Prefix = "fp8_amax.";
constexpr const char* kRankPrefix = "fp8_amax_rank";

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

bool is_fp8_record_state(const std::string& name) {
  return starts_with(name, kRank0Prefix) || starts_with(name, kRankPrefix);
}

NamedTensors fp8_record_state(const std::vector<std::pair<std::string, at::Tensor>>& records, Communicator& comm) {
  const int world = comm.world();
  if (records.empty()) return {};
  if (world == 1) {
    NamedTensors out;
    for (const auto& [module, t] : records) out.emplace_back(kRank0Prefix + module, t);
    return out;
  }
  std::vector<at::Tensor> mine;
  for (const auto& [module, t] : records) mine.push_back(t.reshape({-1}));
  const auto flat = torch::cat(mine);
  auto all = torch::empty({world * flat.numel()}, flat.options());
  comm.all_gather(all, flat, "gathering the fp8 amax records for a checkpoint");
  if (comm.rank() != 0) return {};
  NamedTensors out;
  for (int r = 0; r < world; ++r) {
    int64_t offset = r * flat.numel();
    const std::string prefix = r == 0 ? kRank0Prefix : kRankPrefix + std::to_string(r) + ".";
    for (const auto& [module, t] : records) {
      out.emplace_back(prefix + module, all.narrow(0, offset, t.numel()).view(t.sizes()).clone());
      offset += t.numel();
    }
  }
  return out;
}

std::vector<Fp8RecordEntry> fp8_records_for_rank(const NamedTensors& state, int rank, const std::string& file) {
  std::map<std::string, Fp8RecordEntry> rank0, own;
  for (const auto& [name, t] : state) {
    if (starts_with(name, kRank0Prefix)) {
      const std::string module = name.substr(std::strlen(kRank0Prefix));
      rank0[module] = {name, module, t};
    } else if (starts_with(name, kRankPrefix)) {
      const std::string rest = name.substr(std::strlen(kRankPrefix));
      const size_t dot = rest.find('.');
      if (dot == std::string::npos || dot == 0 || dot + 1 == rest.size() ||
          rest.find_first_not_of("0123456789") != dot)
        throw std::runtime_error(file + ": state entry '" + name + "' is not fp8_amax_rank<r>.<module>");
      if (std::stoi(rest.substr(0, dot)) == rank) {
        const std::string module = rest.substr(dot + 1);
        own[module] = {name, module, t};
      }
    }
  }
  std::vector<Fp8RecordEntry> out;
  for (auto& [module, e] : rank0) out.push_back(own.count(module) ? own[module] : e);
  for (auto& [module, e] : own)
    if (!rank0.count(module)) out.push_back(e);
  return out;
}

}  // namespace trainer
