#include "ui/gui/status_style.h"

namespace ui {

ImVec4 status_color(const std::string& st) {
  if (st == "running") return ImVec4(0.4f, 0.85f, 0.45f, 1);
  if (st == "paused" || st == "stopping" || st == "starting") return ImVec4(1.0f, 0.8f, 0.3f, 1);
  if (st == "stopped") return ImVec4(0.85f, 0.85f, 0.5f, 1);
  if (st == "preempted") return ImVec4(0.45f, 0.7f, 1.0f, 1);
  if (st == "interrupted") return ImVec4(1.0f, 0.65f, 0.25f, 1);
  if (st == "failed") return ImVec4(1.0f, 0.4f, 0.4f, 1);
  if (st == "diverged") return ImVec4(0.95f, 0.45f, 0.85f, 1);
  return ImVec4(0.75f, 0.75f, 0.8f, 1);
}

const char* status_help(const std::string& st) {
  if (st == "stopped") return "Stopped on request with a checkpoint of its last step; it can be resumed.";
  if (st == "preempted")
    return "Stopped with a checkpoint because the launcher took the machine back (SIGTERM under Slurm or\n"
           "with DELTADECK_PREEMPTIBLE=1); resume it when resources are back.";
  if (st == "interrupted")
    return "The process went away without closing the run (a crash, a kill, a lost machine).\n"
           "Its last complete checkpoint can be resumed.";
  if (st == "failed") return "Ended by an error; its last committed checkpoint can be resumed.";
  if (st == "diverged")
    return "Ended after train.max_nonfinite_steps skipped steps in a row (non-finite loss or gradients).\n"
           "Resuming repeats the same steps: change the learning rate or precision first.";
  if (st == "stopping") return "Finishing the current step and saving a checkpoint.";
  return nullptr;
}

bool status_is_failure(const std::string& st) { return st == "failed" || st == "diverged"; }

}  // namespace ui
