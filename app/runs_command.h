// `deltadeck runs list|show`: read-only views of the run database for the terminal.
#pragma once

#include <string>

namespace app {

// Both return the process exit code (1 when the database or the run cannot be found).
int runs_list(const std::string& runs_dir);
int runs_show(const std::string& runs_dir, const std::string& run);

}  // namespace app
