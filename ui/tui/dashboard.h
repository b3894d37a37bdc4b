// The terminal dashboard of a live run: what it draws from a RunView, and what each key does.
// Both are pure (a Screen and a small state struct in, no terminal, no run), so layouts and keys
// are tested without either; app/train_tui.cpp owns the terminal and the run.
//
//   ┌ header: run, model, devices, status; progress bar, step, tokens, elapsed, ETA; latest metrics
//   │ charts: loss (train + val) · grad norm · loss scale (or lr) · tokens/s   (2×2, stacked below 70 columns)
//   │ GPUs: utilization, memory, power, temperature per GPU
//   │ events: checkpoints, evaluations, skipped steps, engine messages (newest last)
//   └ keys: p pause/resume · s save now · q save & quit (asks) · ? help
#pragma once

#include <string>

#include "ui/run_view.h"
#include "ui/tui/screen.h"

namespace ui::tui {

struct DashboardState {
  bool help = false;          // the help box is open
  bool confirm_quit = false;  // "save a checkpoint and quit? [y/N]" is open
  std::string message;        // feedback of the last key, shown in the key row
};

enum class Action { None, Pause, Resume, SaveNow, Stop, Redraw };

// The smallest terminal the dashboard lays out; below it a notice asks for a larger one.
constexpr int MIN_COLS = 50, MIN_ROWS = 16;

// Applies one key to the state and returns what the run should do: p pauses or resumes, s saves
// now, q opens the quit confirmation (y confirms: Stop, which saves a checkpoint; any other key
// cancels), ? toggles the help, Esc closes boxes, Ctrl-L redraws.
Action handle_key(DashboardState& st, char key, const RunView& v);
// The keys typed in a chunk of terminal input, without the escape sequences that function, arrow
// and Alt keys send (F1 is ESC O P: its P must not pause the run). An Esc that starts no sequence
// (alone at the end of the chunk, or before another Esc) stays a key.
std::string typed_keys(const std::string& input);
// Draws the whole dashboard for the screen's size.
void draw_dashboard(Screen& s, const RunView& v, const DashboardState& st);

}  // namespace ui::tui
