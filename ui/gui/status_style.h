// How a run's status looks everywhere the app shows one (the live dashboard, the runs browser,
// compare, the event log): one colour per status and a line saying what it means, so a new status
// is added in one place. ImGui types only.
#pragma once

#include <imgui.h>

#include <string>

namespace ui {

// starting | running | paused | stopping | finished | stopped | preempted | failed | diverged |
// interrupted; anything else is drawn in the neutral grey. Main thread (ImGui).
ImVec4 status_color(const std::string& status);
// What the status means, for a tooltip; nullptr for the self-explanatory ones (running, finished).
const char* status_help(const std::string& status);
// Statuses that end a run badly (drawn as errors in event logs): failed, diverged.
bool status_is_failure(const std::string& status);

}  // namespace ui
