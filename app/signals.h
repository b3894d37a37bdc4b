// SIGINT/SIGTERM handling for runs: the first signal asks for a clean stop (checkpoint, status
// `stopped`); a second SIGINT exits at once, leaving the last complete checkpoint as it is.
#pragma once

namespace app {

// Installs the handlers. Main thread, once per run.
void install_stop_signals();
// How many stop signals arrived so far (async-signal-safe counter).
int stop_signals_received();

}  // namespace app
