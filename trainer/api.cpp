#include "trainer/api.h"

namespace trainer {

const char* status_name(RunStatus s) {
  switch (s) {
    case RunStatus::Running: return "running";
    case RunStatus::Finished: return "finished";
    case RunStatus::Stopped: return "stopped";
    case RunStatus::Failed: return "failed";
    case RunStatus::Preempted: return "preempted";
    case RunStatus::Diverged: return "diverged";
  }
  return "failed";
}

}  // namespace trainer
