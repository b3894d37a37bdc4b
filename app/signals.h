// Signals of a run: the first SIGINT/SIGTERM asks for a clean stop (checkpoint, status `stopped`);
// a second SIGINT exits at once, leaving the last complete checkpoint as it is. With a terminal
// dashboard open, every way out puts the terminal back first: the second SIGINT, a crash
// (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL: restored, then the signal is raised again with its
// default action, so the exit status and core dump stay those of the crash), and Ctrl-Z (restored
// while stopped, dashboard mode entered again on SIGCONT). SIGWINCH is turned into a flag.
#pragma once

namespace app {

// Installs the stop handlers. Main thread, once per run.
void install_stop_signals();
// How many stop signals arrived so far (async-signal-safe counter).
int stop_signals_received();

// The async-signal-safe function that puts the terminal back (ui::tui::Terminal::restore_now), or
// nullptr. Called by the handlers below and by the second SIGINT before it exits.
void set_terminal_restore(void (*restore)());
// Installs the crash, SIGWINCH and Ctrl-Z (SIGTSTP/SIGCONT) handlers for a dashboard. Main thread.
void install_dashboard_signals();
// True once after each SIGWINCH (the terminal was resized) / SIGCONT (the process was continued).
bool take_resized();
bool take_continued();

}  // namespace app
