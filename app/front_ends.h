// The headless front ends of `deltadeck train`: plain log lines (text or JSON) and the terminal
// dashboard. Each runs on the main thread until the run has ended and its end is recorded, reading
// the RunHost and sending it commands; the first SIGINT/SIGTERM/SIGHUP becomes Command::Stop. No torch.
#pragma once

#include <string>

#include "app/run_host.h"

namespace app {

enum class LogFormat { Text, Json };

// Prints the run's records as they come (ui/log/log_line.h has both formats); text errors go to
// stderr. Call after host.start(). Returns how the run ended.
trainer::EndedEvent run_plain_log(RunHost& host, LogFormat format);
// The first lines of a run before its records: text (the start line, database, config table) or
// the JSON "run" object.
void print_run_header(const RunHost& host, LogFormat format, const std::string& version_line);

// The terminal dashboard (ui/tui). Returns false, having changed nothing, when the terminal cannot
// be set up (the caller then uses the plain log); otherwise runs until the run has ended, puts the
// terminal back and prints a short summary on the normal screen. Call after host.start().
bool run_dashboard(RunHost& host, trainer::EndedEvent& ended);

// "2026-11-23T09:30:00.123Z": now, for JSON lines.
std::string utc_now_ms();

}  // namespace app
