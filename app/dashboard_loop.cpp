// The terminal dashboard's main loop: keys in, frames out, the run host in between. The screen is
// redrawn only when the view or the dashboard state changed (or the terminal was resized), and
// only its changed rows are sent.
#include <chrono>
#include <iostream>
#include <thread>

#include "app/front_ends.h"
#include "app/signals.h"
#include "ui/log/log_line.h"
#include "ui/tui/dashboard.h"
#include "ui/tui/terminal.h"

namespace app {

namespace {

// The newest training metrics as a step line, for the summary left on the normal screen.
std::string last_step_line(const ui::RunView& v) {
  trainer::MetricsEvent m{v.step, v.tokens, v.elapsed_s, {}};
  for (const char* key : {"loss", "aux_loss", "grad_norm", "loss_scale", "lr", "tokens_per_s", "mfu", "mem_peak_gib"}) {
    auto it = v.latest.find(key);
    if (it != v.latest.end()) m.values.emplace_back(key, it->second);
  }
  if (!v.loss.empty()) m.step = v.loss.back().step;
  return ui::format_metrics_line(m, v.total_steps);
}

}  // namespace

bool run_dashboard(RunHost& host, trainer::EndedEvent& ended) {
  ui::tui::Terminal term;
  if (!term.open()) return false;
  set_terminal_restore(&ui::tui::Terminal::restore_now);
  install_dashboard_signals();

  int cols = 80, rows = 24;
  ui::tui::Terminal::size(cols, rows);
  ui::tui::Screen screen(cols, rows);
  std::vector<std::string> sent;  // the rows the terminal shows now
  ui::RunView view;
  ui::tui::DashboardState state;
  uint64_t drawn = ~uint64_t{0};
  bool dirty = true;
  int signals_seen = 0;
  bool reenter_pending = false;
  while (!host.ended()) {
    if (stop_signals_received() > signals_seen) {
      signals_seen = stop_signals_received();
      if (signals_seen == 1) {
        host.send(stop_command());  // Preempt for a SIGTERM under Slurm (signals.h)
        state.message = "stop requested: saving a checkpoint (Ctrl-C again exits at once)";
        dirty = true;
      }
    }
    if (take_resized()) {
      ui::tui::Terminal::size(cols, rows);
      screen.resize(cols, rows);
      sent.clear();
      dirty = true;
    }
    // A background job (Ctrl-Z, then bg) must not touch the terminal: setting its mode would stop
    // the whole process (SIGTTOU), training too. It draws again once brought back (fg).
    if (take_continued()) reenter_pending = true;
    if (!ui::tui::Terminal::foreground()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    if (reenter_pending) {
      reenter_pending = false;
      term.reenter();
      sent.clear();
      dirty = true;
    }
    host.snapshot(view);
    if (dirty || view.version != drawn) {
      ui::tui::draw_dashboard(screen, view, state);
      ui::tui::Terminal::write_all(screen.diff(sent));
      drawn = view.version;
      dirty = false;
    }
    for (char key : ui::tui::typed_keys(term.read_input(100))) {
      dirty = true;
      switch (ui::tui::handle_key(state, key, view)) {
        case ui::tui::Action::Pause: host.send(trainer::Command::Pause); break;
        case ui::tui::Action::Resume: host.send(trainer::Command::Resume); break;
        case ui::tui::Action::SaveNow: host.send(trainer::Command::SaveNow); break;
        case ui::tui::Action::Stop: host.send(trainer::Command::Stop); break;
        case ui::tui::Action::Redraw: sent.clear(); break;
        case ui::tui::Action::None: break;
      }
    }
  }
  term.close();
  set_terminal_restore(nullptr);

  ended = host.wait();
  host.snapshot(view);
  const std::string line = last_step_line(view);
  if (!line.empty()) std::cout << line << "\n";
  for (const auto& c : view.checkpoints) std::cout << "checkpoint step " << c.step << " | " << c.path << "\n";
  std::cout << std::flush;
  return true;
}

}  // namespace app
