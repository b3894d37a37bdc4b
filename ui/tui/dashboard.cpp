#include "ui/tui/dashboard.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <vector>

#include "ui/log/log_line.h"
#include "ui/tui/chart.h"

namespace ui::tui {

namespace {

const Style BOLD{Color::Default, true};
const Style GRAY{Color::Gray};

std::string fixed(const char* f, double v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

Style status_style(const std::string& status) {
  Color c = Color::Default;
  if (status == "running" || status == "finished") c = Color::Green;
  else if (status == "paused" || status == "stopping" || status == "starting") c = Color::Yellow;
  else if (status == "stopped" || status == "preempted") c = Color::Blue;
  else if (status == "failed" || status == "diverged") c = Color::Red;
  else if (status == "interrupted") c = Color::Magenta;
  return Style{c, true, true};
}

void draw_header(Screen& s, const RunView& v) {
  const int w = s.cols();
  std::string title = " deltadeck · " + v.run_name + " (run " + std::to_string(v.run_id) + ") · " + v.model + " · " +
                      format_count(static_cast<double>(v.params)) + " params · " +
                      (v.device.empty() ? v.devices : v.device);
  std::string badge = " ";
  for (char c : v.status) badge += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  badge += " ";
  const int badge_x = std::max(0, w - static_cast<int>(badge.size()));
  s.fill_style(0, 0, w, Style{Color::Default, false, true});
  s.put(0, 0, title, Style{Color::Default, true, true}, badge_x - 1);
  s.put(badge_x, 0, badge, status_style(v.status));

  // Row 1: progress.
  int x = s.put(0, 1, "step " + std::to_string(v.step) + "/" + std::to_string(v.total_steps) + " ", BOLD);
  const int bar = std::clamp(w / 4, 10, 40);
  const double frac = v.total_steps > 0 ? std::clamp(static_cast<double>(v.step) / v.total_steps, 0.0, 1.0) : 0.0;
  const int full = static_cast<int>(frac * bar + 0.5);
  for (int i = 0; i < bar; ++i) s.set(x + i, 1, i < full ? "█" : "░", Style{i < full ? Color::Green : Color::Gray});
  x += bar;
  std::string rest = fixed(" %5.1f%%", 100.0 * frac) + "  tokens " + format_count(static_cast<double>(v.tokens)) +
                     "  elapsed " + format_duration(v.elapsed_s) +
                     "  eta " + (v.eta_s >= 0 && v.status == "running" ? format_duration(v.eta_s) : std::string("-"));
  s.put(x, 1, rest);

  // Row 2: the newest value of each headline metric the run has.
  std::vector<std::pair<std::string, Style>> parts;
  auto has = [&](const char* k, double& out) {
    auto it = v.latest.find(k);
    if (it == v.latest.end()) return false;
    out = it->second;
    return true;
  };
  double m = 0;
  if (has("loss", m)) parts.push_back({"loss " + fixed("%.4f", m), Style{Color::Cyan}});
  if (has("val_loss", m)) parts.push_back({"val " + fixed("%.4f", m), Style{Color::Yellow}});
  if (has("grad_norm", m)) parts.push_back({"grad_norm " + fixed("%.3f", m), {}});
  if (has("lr", m)) parts.push_back({"lr " + fixed("%.2e", m), {}});
  if (has("loss_scale", m) && m != 1.0) parts.push_back({"scale " + fixed("%.0f", m), {}});
  if (has("tokens_per_s", m)) parts.push_back({format_count(m) + " tok/s", {}});
  if (has("mfu", m)) parts.push_back({"mfu " + fixed("%.1f", 100 * m) + "%", {}});
  if (has("mem_peak_gib", m)) parts.push_back({"mem " + fixed("%.1f", m) + " GiB", {}});
  if (has("skipped_steps", m) && m > 0) parts.push_back({"skipped " + fixed("%.0f", m), Style{Color::Yellow}});
  x = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) x = s.put(x, 2, " │ ", GRAY);
    x = s.put(x, 2, parts[i].first, parts[i].second);
  }
  if (parts.empty()) s.put(0, 2, v.status == "starting" ? "starting the engine..." : "waiting for the first step...", GRAY);
}

void draw_gpus(Screen& s, const RunView& v, int y, int h) {
  if (v.gpus.empty()) {
    s.put(0, y, "GPUs  no telemetry (CPU run, or NVML not found)", GRAY);
    return;
  }
  s.put(0, y, "GPU   util          memory      power   temp   clock", BOLD);
  for (int i = 0; i < static_cast<int>(v.gpus.size()) && i + 1 < h; ++i) {
    const GpuStats& g = v.gpus[static_cast<size_t>(i)];
    const int row = y + 1 + i;
    int x = s.put(0, row, fixed("%-4.0f", g.index) + "  " + fixed("%3.0f%% ", g.util));
    const int bar = 8, full = static_cast<int>(std::clamp(g.util, 0.0, 100.0) / 100.0 * bar + 0.5);
    for (int b = 0; b < bar; ++b) s.set(x + b, row, b < full ? "█" : "░", Style{b < full ? Color::Green : Color::Gray});
    x += bar;
    s.put(x, row, fixed("  %6.1f GiB", g.mem_used_gib) + fixed("  %5.0f W", g.power_w) + fixed("  %3.0f°C", g.temp_c) +
                      fixed("  %5.0f MHz", g.sm_clock_mhz));
  }
  if (static_cast<int>(v.gpus.size()) + 1 > h) {
    s.put(s.cols() - 12, y, "+" + std::to_string(v.gpus.size() + 1 - static_cast<size_t>(h)) + " more", GRAY);
  }
}

std::string event_text(const LogRecord& r) {
  if (r.kind == "log" && r.level != "info") return r.level + ": " + r.text;
  if (r.kind == "ended") return "run " + r.status + ": " + r.text;
  return r.text;
}

Style event_style(const LogRecord& r) {
  if (r.level == "error") return Style{Color::Red};
  if (r.level == "warn") return Style{Color::Yellow};
  if (r.kind == "checkpoint") return Style{Color::Green};
  if (r.kind == "eval") return Style{Color::Cyan};
  if (r.kind == "backoff") return Style{Color::Yellow};
  return {};
}

void draw_events(Screen& s, const RunView& v, int y, int h) {
  s.put(0, y, "events", BOLD);
  if (v.events_total > static_cast<int64_t>(v.events.size())) {
    s.put(7, y, "(last " + std::to_string(v.events.size()) + " of " + std::to_string(v.events_total) + ")", GRAY);
  }
  const int lines = h - 1;
  const int n = std::min<int>(lines, static_cast<int>(v.events.size()));
  for (int i = 0; i < n; ++i) {
    const LogRecord& r = v.events[v.events.size() - static_cast<size_t>(n - i)];
    const int row = y + 1 + i;
    const int x = s.put(0, row, fixed("%8.0f  ", static_cast<double>(r.step)), GRAY);
    s.put(x, row, event_text(r), event_style(r));
  }
}

void draw_keys(Screen& s, const RunView& v, const DashboardState& st) {
  const int y = s.rows() - 1;
  if (st.confirm_quit) {
    s.put(0, y, " Save a checkpoint and quit? [y/N] ", Style{Color::Yellow, true, true});
    return;
  }
  const bool paused = v.status == "paused";
  int x = 0;
  auto key = [&](const char* k, const std::string& what) {
    x = s.put(x, y, std::string(" ") + k + " ", Style{Color::Default, true, true});
    x = s.put(x, y, " " + what + " ");
  };
  key("p", paused ? "resume" : "pause");
  key("s", "save now");
  key("q", "save & quit");
  key("?", "help");
  if (!st.message.empty()) s.put(x + 1, y, st.message, Style{Color::Yellow});
}

void draw_box(Screen& s, const std::vector<std::string>& lines, Style style) {
  int inner = 0;
  for (const auto& l : lines) inner = std::max(inner, text_width(l));
  const int w = std::min(s.cols(), inner + 4), h = std::min(s.rows(), static_cast<int>(lines.size()) + 2);
  const int x0 = (s.cols() - w) / 2, y0 = (s.rows() - h) / 2;
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      const bool top = y == 0, bottom = y == h - 1, left = x == 0, right = x == w - 1;
      std::string g = " ";
      if ((top || bottom) && (left || right)) g = top ? (left ? "┌" : "┐") : (left ? "└" : "┘");
      else if (top || bottom) g = "─";
      else if (left || right) g = "│";
      s.set(x0 + x, y0 + y, g, style);
    }
  }
  for (int i = 0; i < static_cast<int>(lines.size()) && i < h - 2; ++i) {
    s.put(x0 + 2, y0 + 1 + i, lines[static_cast<size_t>(i)], style, w - 4);
  }
}

}  // namespace

std::string typed_keys(const std::string& input) {
  constexpr char ESC = '\x1b';
  std::string out;
  for (size_t i = 0; i < input.size(); ++i) {
    if (input[i] != ESC) {
      out += input[i];
      continue;
    }
    if (i + 1 == input.size() || input[i + 1] == ESC) {
      out += ESC;  // the Esc key itself
      continue;
    }
    const char kind = input[i + 1];
    if (kind == '[') {
      // CSI: parameters and intermediates up to a final byte in @..~ (arrows, F5 and up, Home...).
      size_t j = i + 2;
      while (j < input.size() && !(input[j] >= '@' && input[j] <= '~')) ++j;
      i = j;
    } else if (kind == 'O') {
      i += 2;  // SS3: one more byte (F1 to F4, arrows in application mode)
    } else {
      i += 1;  // Alt plus a key
    }
  }
  return out;
}

Action handle_key(DashboardState& st, char key, const RunView& v) {
  if (st.confirm_quit) {
    st.confirm_quit = false;
    if (key == 'y' || key == 'Y') {
      st.message = "saving a checkpoint and stopping...";
      return Action::Stop;
    }
    st.message = "quit cancelled";
    return Action::None;
  }
  const bool was_help = st.help;
  st.help = false;
  const bool over = v.ended() || v.status == "stopping";
  switch (key) {
    case 'p':
    case 'P':
      if (over) break;
      if (v.status == "paused") {
        st.message = "resuming";
        return Action::Resume;
      }
      st.message = "pausing at the next step boundary";
      return Action::Pause;
    case 's':
    case 'S':
      if (over) break;
      st.message = "checkpoint requested at the next step boundary";
      return Action::SaveNow;
    case 'q':
    case 'Q':
      if (over) break;
      st.confirm_quit = true;
      st.message.clear();
      return Action::None;
    case '?':
    case 'h':
      st.help = !was_help;
      return Action::None;
    case 0x0c:  // Ctrl-L
      return Action::Redraw;
    default:
      return Action::None;
  }
  st.message = "the run is " + v.status;
  return Action::None;
}

void draw_dashboard(Screen& s, const RunView& v, const DashboardState& st) {
  s.clear();
  const int w = s.cols(), h = s.rows();
  if (w < MIN_COLS || h < MIN_ROWS) {
    s.put(0, 0, "deltadeck: " + v.run_name + " " + v.status, BOLD);
    s.put(0, 1, "step " + std::to_string(v.step) + "/" + std::to_string(v.total_steps));
    s.put(0, 2, "terminal " + std::to_string(w) + "x" + std::to_string(h) + " is too small; the dashboard needs " +
                    std::to_string(MIN_COLS) + "x" + std::to_string(MIN_ROWS),
          Style{Color::Yellow});
    draw_keys(s, v, st);
    return;
  }
  draw_header(s, v);
  // Body: rows 3 .. h-2 (the last row holds the keys).
  const int body_y = 3, body_h = h - 4;
  const int gpu_h = v.gpus.empty() ? 1 : 1 + std::min<int>(static_cast<int>(v.gpus.size()), 8);
  int events_h = std::clamp(body_h / 4, 3, 12);
  int charts_h = body_h - gpu_h - events_h - 1;
  if (charts_h < 4) {
    events_h = std::max(2, events_h - (4 - charts_h));
    charts_h = body_h - gpu_h - events_h - 1;
  }

  // Without loss scaling (fp32, bf16) the scale is 1 throughout: its slot shows the learning rate.
  const bool scaling = std::any_of(v.loss_scale.begin(), v.loss_scale.end(),
                                   [](const ui::SeriesPoint& p) { return p.value != 1.0; });
  const std::vector<ChartSpec> charts = {
      {"loss", {{&v.loss, Color::Cyan, "train"}, {&v.val_loss, Color::Yellow, "val"}}, false},
      {"grad norm", {{&v.grad_norm, Color::Magenta, ""}}, false},
      scaling ? ChartSpec{"loss scale", {{&v.loss_scale, Color::Blue, ""}}, true}
              : ChartSpec{"lr (loss scaling off)", {{&v.lr, Color::Blue, ""}}, false},
      {"tokens/s", {{&v.tokens_per_s, Color::Green, ""}}, false},
  };
  if (w >= 70 && charts_h >= 8) {
    const int cw = w / 2, ch = charts_h / 2;
    for (int i = 0; i < 4; ++i) {
      draw_chart(s, (i % 2) * cw + (i % 2), body_y + (i / 2) * ch, cw - 1, ch, charts[static_cast<size_t>(i)]);
    }
  } else {
    const int n = std::clamp(charts_h / 5, 1, 4);
    const int ch = charts_h / n;
    for (int i = 0; i < n; ++i) draw_chart(s, 0, body_y + i * ch, w, ch, charts[static_cast<size_t>(i)]);
  }
  const int gpu_y = body_y + charts_h;
  draw_gpus(s, v, gpu_y, gpu_h);
  draw_events(s, v, gpu_y + gpu_h + 1, events_h);
  draw_keys(s, v, st);

  if (st.help) {
    draw_box(s,
             {"deltadeck dashboard: keys", "",
              "p        pause / resume (at the next step boundary)",
              "s        save a checkpoint now",
              "q        save a checkpoint and quit (asks first)",
              "?        this help (any key closes it)",
              "Ctrl-L   redraw the screen",
              "Ctrl-C   stop with a checkpoint; twice: exit at once", "",
              "Database " + v.db_path, "Checkpoints " + v.run_dir + "/checkpoints"},
             Style{});
  }
}

}  // namespace ui::tui
