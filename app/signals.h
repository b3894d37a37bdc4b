// Signals of a run: the first SIGINT/SIGTERM/SIGHUP asks for a clean stop (checkpoint, status
// `stopped`, or `preempted` when the launcher says a SIGTERM means preemption: SLURM_JOB_ID is set,
// or DELTADECK_PREEMPTIBLE=1); a second one exits at once (status 128 + signal), leaving
// the last committed checkpoint and database transaction as they are. The handlers restart
// interrupted system calls (SA_RESTART), so a signal landing on a writer thread never fails a write. With a terminal
// dashboard open, every way out puts the terminal back first: the second SIGINT, a crash
// (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL: restored, then the signal is raised again with its
// default action, so the exit status and core dump stay those of the crash), and Ctrl-Z (restored
// while stopped, dashboard mode entered again on SIGCONT). SIGWINCH is turned into a flag. SIGPIPE
// is ignored: a write to a dead peer or a closed stdout fails with EPIPE rather than killing the run.
// A SIGBUS in a memory-mapped corpus file (truncated while the run reads it) names the file and the
// byte on stderr before the process ends with the signal's default action.
#pragma once

#include "trainer/api.h"

namespace app {

// Installs the stop handlers and reads whether a SIGTERM means preemption here. Main thread, once
// per run.
void install_stop_signals();
// How many stop signals arrived so far (async-signal-safe counter).
int stop_signals_received();
// The command for the first stop signal: Preempt for a SIGTERM under a launcher that preempts
// (SLURM_JOB_ID set, or DELTADECK_PREEMPTIBLE=1; DELTADECK_PREEMPTIBLE=0 turns it off), else Stop.
// Any thread.
trainer::Command stop_command();

// The async-signal-safe function that puts the terminal back (ui::tui::Terminal::restore_now), or
// nullptr. Called by the handlers below and by the second SIGINT before it exits.
void set_terminal_restore(void (*restore)());
// Installs the crash, SIGWINCH and Ctrl-Z (SIGTSTP/SIGCONT) handlers for a dashboard. Main thread.
void install_dashboard_signals();
// True once after each SIGWINCH (the terminal was resized) / SIGCONT (the process was continued).
bool take_resized();
bool take_continued();

}  // namespace app
