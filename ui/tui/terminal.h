// The terminal the dashboard draws on: plain ANSI escapes and termios, no curses. Opening it
// switches to the alternate screen with the cursor hidden and the keyboard unbuffered (Ctrl-C still
// sends SIGINT); closing it puts back exactly the settings it found.
//
// restore_now() is the one function signal handlers may call (it uses only write() and tcsetattr(),
// both async-signal-safe), so a crash or a second Ctrl-C never leaves the user's shell raw and blank.
#pragma once

#include <string>
#include <vector>

namespace ui::tui {

class Terminal {
 public:
  Terminal() = default;
  // Restores the terminal if still open.
  ~Terminal();
  Terminal(const Terminal&) = delete;
  Terminal& operator=(const Terminal&) = delete;

  // True when stdin and stdout are terminals, TERM is not "dumb" and this process is in the
  // terminal's foreground (a background job that set the terminal's mode would be stopped by
  // SIGTTOU, its training with it): a dashboard can run. Any thread.
  static bool usable();
  // Whether this process's group owns the terminal now (not a background job after Ctrl-Z, bg).
  // Any thread.
  static bool foreground();
  // Enters dashboard mode. False (and nothing changed) when the terminal settings cannot be read.
  // Main thread; one Terminal open at a time.
  bool open();
  // Leaves dashboard mode (idempotent). Main thread.
  void close();
  // After the process was stopped (Ctrl-Z) and continued: the shell has reset the terminal, so
  // dashboard mode is entered again. Main thread.
  void reenter();
  bool is_open() const { return open_; }

  // Columns and rows (80x24 when the size cannot be read). Any thread.
  static void size(int& cols, int& rows);
  // Waits up to timeout_ms for input and returns the bytes read (empty on timeout or a signal).
  // Once the terminal is gone (hung up, closed) it still waits timeout_ms, so a caller's loop
  // does not spin.
  std::string read_input(int timeout_ms);
  // Writes all of text to stdout (retrying partial writes). Main thread.
  static void write_all(const std::string& text);

  // Async-signal-safe: leaves dashboard mode if a Terminal is open. For signal handlers.
  static void restore_now();

 private:
  bool open_ = false;
};

}  // namespace ui::tui
