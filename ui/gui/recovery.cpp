#include "ui/gui/recovery.h"

namespace ui {

bool devices_use_gpu(const std::string& run_devices, const std::vector<std::string>& devices) {
  if (run_devices == "cpu" || run_devices.rfind("cpu:", 0) == 0) return false;
  if (run_devices == "auto" || run_devices.empty()) {
    for (const auto& d : devices)
      if (d.rfind("cuda", 0) == 0) return true;
    return false;
  }
  return true;
}

std::string gpu_refusal(const std::string& run_devices, const std::vector<std::string>& devices,
                        const std::string& cuda_blocked) {
  if (cuda_blocked.empty() || !devices_use_gpu(run_devices, devices)) return "";
  return "this process can no longer use the GPU: " + cuda_blocked +
         ". Resume or start GPU runs in a new deltadeck process (or restart the app); CPU runs "
         "(run.devices = \"cpu\") can still start here.";
}

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+@%") ==
                        std::string::npos)
    return s;
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}

std::string resume_command(const std::string& exe, int64_t run_id, const std::string& runs_dir) {
  return shell_quote(exe) + " train --resume " + std::to_string(run_id) + " --runs-dir " + shell_quote(runs_dir);
}

}  // namespace ui
