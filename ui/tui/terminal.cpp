// Terminal modes through termios and ANSI escapes. The saved settings live in file statics (not the
// object) so restore_now() can reach them from a signal handler without touching anything a
// handler must not.
#include "ui/tui/terminal.h"

#include <poll.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>

namespace ui::tui {

namespace {

// Alternate screen on, cursor hidden, screen cleared.
constexpr char ENTER[] = "\x1b[?1049h\x1b[?25l\x1b[H\x1b[2J";
// Attributes reset, cursor shown, alternate screen off (the shell's screen comes back as it was).
constexpr char LEAVE[] = "\x1b[0m\x1b[?25h\x1b[?1049l";

struct termios g_saved;
volatile std::sig_atomic_t g_active = 0;

void write_raw(const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(STDOUT_FILENO, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    p += w;
    n -= static_cast<size_t>(w);
  }
}

bool enter_mode() {
  struct termios raw = g_saved;
  // Keys arrive one by one without echo; ISIG stays on, so Ctrl-C and Ctrl-Z still signal.
  raw.c_lflag &= ~(ICANON | ECHO);
  raw.c_cc[VMIN] = 0;
  raw.c_cc[VTIME] = 0;
  if (::tcsetattr(STDIN_FILENO, TCSANOW, &raw) != 0) return false;
  g_active = 1;
  write_raw(ENTER, sizeof ENTER - 1);
  return true;
}

}  // namespace

Terminal::~Terminal() { close(); }

bool Terminal::usable() {
  if (!::isatty(STDIN_FILENO) || !::isatty(STDOUT_FILENO)) return false;
  const char* term = std::getenv("TERM");
  return term && *term && std::strcmp(term, "dumb") != 0 && foreground();
}

bool Terminal::foreground() { return ::tcgetpgrp(STDIN_FILENO) == ::getpgrp(); }

bool Terminal::open() {
  if (open_) return true;
  if (::tcgetattr(STDIN_FILENO, &g_saved) != 0) return false;
  open_ = enter_mode();
  return open_;
}

void Terminal::close() {
  if (!open_) return;
  restore_now();
  open_ = false;
}

void Terminal::reenter() {
  if (!open_) return;
  // The shell may have changed the settings while we were stopped; ours are re-derived from the
  // ones saved at open (what the user's shell wants back).
  enter_mode();
}

void Terminal::size(int& cols, int& rows) {
  struct winsize ws {};
  if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 && ws.ws_row > 0) {
    cols = ws.ws_col;
    rows = ws.ws_row;
  } else {
    cols = 80;
    rows = 24;
  }
}

std::string Terminal::read_input(int timeout_ms) {
  struct pollfd p {STDIN_FILENO, POLLIN, 0};
  const int ready = ::poll(&p, 1, timeout_ms);
  auto idle = [&] {
    // A hung-up or closed terminal makes poll return at once, every time: wait out the timeout.
    ::poll(nullptr, 0, timeout_ms);
    return std::string();
  };
  if (ready <= 0) return "";
  if (!(p.revents & POLLIN)) return (p.revents & (POLLHUP | POLLERR | POLLNVAL)) ? idle() : "";
  char buf[64];
  const ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
  if (n == 0) return idle();  // end of input: the terminal went away
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

void Terminal::write_all(const std::string& text) { write_raw(text.data(), text.size()); }

void Terminal::restore_now() {
  if (!g_active) return;
  g_active = 0;
  write_raw(LEAVE, sizeof LEAVE - 1);
  ::tcsetattr(STDIN_FILENO, TCSANOW, &g_saved);
}

}  // namespace ui::tui
