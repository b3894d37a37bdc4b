// What the app offers when a run cannot go on in this process: after a multi-GPU run failed, the
// engine refuses further CUDA work here (trainer::cuda_blocked_reason()), so a GPU run is refused
// next to the Start and resume buttons and resumed in a new deltadeck process instead. Plain
// values and strings, no ImGui: the panels draw them, tests/ui checks them.
// The one decision a reader might undo: whether a run would use the GPU is read from run.devices
// as written (and, for "auto", from the devices the launcher found), not by asking the engine,
// because panels must not call into torch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ui {

// Whether run.devices puts a run on a GPU: "cpu" and "cpu:N" do not; "auto" does when the machine
// has one (`devices`: the launcher's list, "cuda:0 (...)" entries for GPUs); "0", "0,1", "all" do.
// Any thread.
bool devices_use_gpu(const std::string& run_devices, const std::vector<std::string>& devices);

// Why a run with run.devices `run_devices` cannot start in this process ("" when it can): the GPU
// is blocked here (`cuda_blocked` non-empty) and the run would use it. Any thread.
std::string gpu_refusal(const std::string& run_devices, const std::vector<std::string>& devices,
                        const std::string& cuda_blocked);

// `s` quoted for a POSIX shell when it needs it ("runs" stays runs, "my runs" becomes 'my runs').
std::string shell_quote(const std::string& s);

// The command line that resumes run `run_id` of the database in `runs_dir` in a new process, as a
// user would type it: "deltadeck train --resume 7 --runs-dir runs" (exe: the program's path).
std::string resume_command(const std::string& exe, int64_t run_id, const std::string& runs_dir);

}  // namespace ui
