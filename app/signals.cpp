// Handlers do only async-signal-safe things: bump sig_atomic_t flags, call the terminal restore
// hook (write + tcsetattr), reset a disposition and re-raise, write() a message, _exit().
#include "app/signals.h"

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

#include "trainer/data/mapped_files.h"

namespace app {

namespace {
volatile std::sig_atomic_t g_stop_signals = 0;
volatile std::sig_atomic_t g_first_signal = 0;
bool g_sigterm_preempts = false;
volatile std::sig_atomic_t g_resized = 0;
volatile std::sig_atomic_t g_continued = 0;
void (*volatile g_restore)() = nullptr;

constexpr int CRASH_SIGNALS[] = {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL};

void restore_terminal() {
  if (auto f = g_restore) f();
}

void on_stop_signal(int sig) {
  if (g_stop_signals == 0) g_first_signal = sig;
  g_stop_signals = g_stop_signals + 1;
  if (g_stop_signals >= 2) {
    restore_terminal();
    static const char msg[] = "\nsecond stop signal: exiting now; the last committed checkpoint is kept\n";
    ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)ignored;
    // The checkpoint protocol and SQLite's journal make this safe at any instant: an unfinished
    // save is never chosen, an unfinished transaction is rolled back by the next open.
    _exit(128 + sig);
  }
}

void on_crash(int sig) {
  restore_terminal();
  // SA_RESETHAND already restored the default action; raising again ends the process as the crash
  // would have (status, core dump).
  std::signal(sig, SIG_DFL);
  raise(sig);
}

// A bus error in a memory-mapped corpus file (truncated while the run read it) is named with the
// file and byte before the process ends as the signal's default action would end it. Several
// threads can fault at once (the data loader's threads reading the same truncated file): the first
// writes the report and ends the process; the others wait in pause() for that end. (With
// SA_RESETHAND a second thread's fault met the default action and ended the process in the middle
// of the first one's report: the file named, the byte and the rest cut off.)
std::atomic<bool> g_bus_error_reporting{false};
static_assert(std::atomic<bool>::is_always_lock_free, "the handler's flag is lock-free");

void on_bus_error(int sig, siginfo_t* info, void*) {
  if (g_bus_error_reporting.exchange(true)) {
    for (;;) pause();
  }
  restore_terminal();
  if (info != nullptr) trainer::data::report_mapped_fault(info->si_addr, STDERR_FILENO);
  std::signal(sig, SIG_DFL);
  raise(sig);
}

void install_bus_error_report() {
  struct sigaction sa {};
  sa.sa_sigaction = on_bus_error;
  sa.sa_flags = SA_SIGINFO;  // not SA_RESETHAND: a second faulting thread waits (on_bus_error)
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, nullptr);
}

void on_resize(int) { g_resized = 1; }

void on_suspend(int) {
  restore_terminal();
  std::signal(SIGTSTP, SIG_DFL);
  // Pending until this handler returns, then stops the process with the terminal already sane.
  raise(SIGTSTP);
}

void on_continue(int) {
  g_continued = 1;
  struct sigaction sa {};
  sa.sa_handler = on_suspend;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTSTP, &sa, nullptr);
}

void install(int sig, void (*handler)(int), int flags) {
  struct sigaction sa {};
  sa.sa_handler = handler;
  sa.sa_flags = flags;
  sigemptyset(&sa.sa_mask);
  sigaction(sig, &sa, nullptr);
}
}  // namespace

void install_stop_signals() {
  const char* slurm = std::getenv("SLURM_JOB_ID");
  const char* flag = std::getenv("DELTADECK_PREEMPTIBLE");
  g_sigterm_preempts = flag ? std::strcmp(flag, "1") == 0 : (slurm && *slurm);
  // SA_RESTART: the signal lands on whichever thread runs; a write, an fsync or a lock wait of a
  // writer thread must go on rather than fail with EINTR.
  install(SIGINT, on_stop_signal, SA_RESTART);
  install(SIGTERM, on_stop_signal, SA_RESTART);
  // The terminal going away (a closed window, a dropped ssh session, a killed tmux) stops the run
  // with a checkpoint too, where the default action would end it without one and leave the run
  // 'running' in the database. The dashboard's writes to the gone terminal fail and are dropped.
  // Started under nohup (SIGHUP ignored), the run goes on, as the user asked.
  struct sigaction hup {};
  if (sigaction(SIGHUP, nullptr, &hup) == 0 && hup.sa_handler != SIG_IGN) install(SIGHUP, on_stop_signal, SA_RESTART);
  // A write to a peer that is gone (another rank's socket after it died, a closed pipe on stdout)
  // fails with EPIPE, which the collective or the log turns into an error the run records (status
  // failed, the rank named). SIGPIPE's default action would end the process at once instead: exit
  // 141, the run left 'running' in the database.
  std::signal(SIGPIPE, SIG_IGN);
  install_bus_error_report();
}

int stop_signals_received() { return static_cast<int>(g_stop_signals); }

trainer::Command stop_command() {
  return g_first_signal == SIGTERM && g_sigterm_preempts ? trainer::Command::Preempt : trainer::Command::Stop;
}

void set_terminal_restore(void (*restore)()) { g_restore = restore; }

void install_dashboard_signals() {
  for (int sig : CRASH_SIGNALS) install(sig, on_crash, SA_RESETHAND);
  install_bus_error_report();  // SIGBUS: the terminal put back too, and a mapped corpus file named
  // SA_RESTART keeps other threads' blocking calls going through a resize; the dashboard's own
  // poll() returns early and checks the flag.
  install(SIGWINCH, on_resize, SA_RESTART);
  install(SIGTSTP, on_suspend, 0);
  install(SIGCONT, on_continue, SA_RESTART);
}

bool take_resized() {
  if (!g_resized) return false;
  g_resized = 0;
  return true;
}

bool take_continued() {
  if (!g_continued) return false;
  g_continued = 0;
  return true;
}

}  // namespace app
