#include "app/gui_script.h"

#include <dirent.h>
#include <sys/resource.h>

#include <imgui.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "app/gui_fonts.h"
#include "ui/gui/metric_plots.h"

namespace app {

namespace {

double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  std::string w;
  while (in >> w) out.push_back(w);
  return out;
}

// A live run that never trains: n points in every series the dashboard plots, with spikes,
// loss-scaler back-offs and two GPUs of telemetry, for the frame-time benchmark.
void make_synthetic_run(ui::GuiState& s, int64_t n) {
  ui::LiveRun& live = s.live;
  live = ui::LiveRun{};
  live.active = true;
  ui::RunView& v = live.view;
  v.run_name = "synthetic";
  v.model = "gpt/base";
  v.params = 124000000;
  v.device = "2 GPUs (synthetic)";
  v.status = "running";
  v.total_steps = n;
  v.step = n;
  v.tokens = n * 524288;
  v.elapsed_s = static_cast<double>(n) * 0.25;
  v.eta_s = 0;
  std::mt19937 rng(1);
  std::normal_distribution<double> noise(0, 1);
  ui::RunHistory& h = live.history;
  double scale = 65536;
  for (int64_t i = 1; i <= n; ++i) {
    const double t = static_cast<double>(i) / static_cast<double>(n);
    const int64_t tokens = i * 524288;
    const double wall = static_cast<double>(i) * 0.25;
    double loss = 2.8 + 8.0 * std::exp(-t * 40) + 0.05 * noise(rng);
    if (i % 99991 == 0) loss += 4;  // rare spikes: each must stay visible
    h.append(i, tokens, wall, "loss", loss);
    h.append(i, tokens, wall, "grad_norm", 0.3 + 0.1 * std::fabs(noise(rng)) + (i % 77777 == 0 ? 30 : 0));
    if (i % 5003 == 0) scale /= 2;
    if (i % 20011 == 0) scale *= 4;
    h.append(i, tokens, wall, "loss_scale", std::min(scale, 1e9));
    h.append(i, tokens, wall, "lr", 6e-4 * 0.5 * (1 + std::cos(M_PI * t)));
    h.append(i, tokens, wall, "tokens_per_s", 2.1e6 + 4e4 * noise(rng));
    h.append(i, tokens, wall, "mfu", 0.52 + 0.01 * noise(rng));
    h.append(i, tokens, wall, "skipped_steps", static_cast<double>(i / 5003));
    for (int g = 0; g < 2; ++g) {
      const std::string p = "gpu" + std::to_string(g);
      h.append(i, tokens, wall, p + ".util", 97 + 2 * noise(rng));
      h.append(i, tokens, wall, p + ".mem_used_gib", 61 + g + 0.2 * noise(rng));
      h.append(i, tokens, wall, p + ".power_w", 640 + 20 * noise(rng));
      h.append(i, tokens, wall, p + ".temp_c", 71 + g * 3 + noise(rng));
    }
    if (i % 100 == 0) h.append(i, tokens, wall, "val_loss", loss + 0.05);
  }
  for (int64_t c = n / 5; c <= n; c += n / 5) v.checkpoints.push_back({c, "synthetic", 1500000000});
  s.tab = ui::Tab::Live;
  s.select_tab = true;
  s.dashboard.smoothing = 0.6;
}

// An unfinished save under a checkpoints folder (a "step_X.tmp" directory); "" when none.
std::string find_unfinished_save(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (!d) return "";
  std::string found;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind("step_", 0) == 0 && name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0)
      found = dir + "/" + name;
  }
  closedir(d);
  return found;
}

}  // namespace

GuiScript::GuiScript(const std::string& path, const std::string& text) {
  std::string body = text;
  if (body.empty() && !path.empty()) {
    std::ifstream in(path);
    if (!in) {
      fail("cannot read the script " + path);
      return;
    }
    std::stringstream ss;
    ss << in.rdbuf();
    body = ss.str();
  }
  std::istringstream in(body);
  std::string line;
  while (std::getline(in, line)) {
    const auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    if (line.find_first_not_of(" \t\r") != std::string::npos) lines_.push_back(line);
  }
  done_ = lines_.empty();
}

void GuiScript::fail(const std::string& why) {
  failed_ = true;
  done_ = true;
  error_ = why;
  std::fprintf(stderr, "gui script: FAILED: %s\n", why.c_str());
}

bool GuiScript::wants_frame() const {
  return frames_left_ > 0 || !screenshot_.empty() || bench_left_ > 0 || stall_ms_ > 0;
}

bool write_plot_areas(const std::string& path, const ui::GuiState& s, float scale, int image_h) {
  const std::map<std::string, ui::PlotState>* plots = s.tab == ui::Tab::Live      ? &s.dashboard.plots
                                                      : s.tab == ui::Tab::Compare ? &s.compare.plots
                                                                                  : nullptr;
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return false;
  if (plots)
    for (const auto& [title, st] : *plots) {
      if (st.drawn_frame != ImGui::GetFrameCount()) continue;
      const int x0 = static_cast<int>(st.area_min.x * scale), y0 = static_cast<int>(st.area_min.y * scale);
      const int x1 = static_cast<int>(st.area_max.x * scale), y1 = static_cast<int>(st.area_max.y * scale);
      // Below the view (scrolled away under the status bar): not all of it is on the image.
      if (y1 > image_h - static_cast<int>(50 * scale) || y0 < 0) continue;
      std::string name = title;
      std::replace(name.begin(), name.end(), ' ', '_');
      std::fprintf(f, "%s %d %d %d %d", name.c_str(), x0, y0, x1, y1);
      for (size_t i = 0; i < st.colors.size(); ++i) {
        const ImU32 c = st.colors[i];
        std::fprintf(f, " %02X%02X%02X:%zu", (c >> IM_COL32_R_SHIFT) & 0xFF, (c >> IM_COL32_G_SHIFT) & 0xFF,
                     (c >> IM_COL32_B_SHIFT) & 0xFF, i < st.counts.size() ? st.counts[i] : 0);
      }
      std::fprintf(f, "\n");
    }
  return std::fclose(f) == 0;
}

void GuiScript::tick(GuiController& ctl, double now) {
  if (stall_report_ && stall_ms_ == 0) {
    // The frame that slept has ended and update() has taken a fresh snapshot.
    const auto& v = ctl.state().live.view;
    std::printf("gui stall: frame loop slept %.1f s; training went from step %lld to %lld meanwhile\n",
                now - stall_started_, static_cast<long long>(stall_step_before_), static_cast<long long>(v.step));
    std::fflush(stdout);
    stall_report_ = false;
  }
  if (idle_until_ > 0) {
    if (now < idle_until_) return;
    const double wall = now - idle_start_;
    const double cpu = cpu_seconds() - idle_cpu_start_;
    std::printf("gui bench idle: %.1f s, CPU %.2f%% of a core, %llu frames drawn (%.2f per second)\n", wall,
                100.0 * cpu / wall, static_cast<unsigned long long>(frames_total_ - idle_frames_start_),
                static_cast<double>(frames_total_ - idle_frames_start_) / wall);
    std::fflush(stdout);
    idle_until_ = 0;
  }
  if (frames_left_ > 0 || bench_left_ > 0 || !screenshot_.empty() || stall_ms_ > 0) return;
  try {
    while (!done_ && step_command(ctl, now)) {
    }
  } catch (const std::exception& e) {
    fail(lines_[std::min(pc_, lines_.size() - 1)] + ": " + e.what());
  }
}

void GuiScript::in_frame() {
  if (stall_ms_ <= 0) return;
  std::this_thread::sleep_for(std::chrono::milliseconds(stall_ms_));
  stall_ms_ = 0;
}

// Runs the current command; true when it finished and the next may run in this same tick.
bool GuiScript::step_command(GuiController& ctl, double now) {
  if (pc_ >= lines_.size()) {
    done_ = true;
    return false;
  }
  const std::string& line = lines_[pc_];
  const auto w = words(line);
  const std::string& cmd = w[0];
  ui::GuiState& s = ctl.state();
  auto arg = [&](size_t i, double def) { return w.size() > i ? std::stod(w[i]) : def; };
  auto wait = [&](bool ok, double timeout_s) {
    if (ok) {
      wait_deadline_ = -1;
      ++pc_;
      return true;
    }
    if (wait_deadline_ < 0) wait_deadline_ = now + timeout_s;
    if (now > wait_deadline_) fail("timed out after " + std::to_string(timeout_s) + " s: " + line);
    return false;
  };

  if (cmd == "start") {
    const bool expect_fail = w.size() > 1 && w[1] == "expect_fail";
    const bool was_active = ctl.run_active();
    s.actions.push_back(ui::act::StartRun{});
    ctl.handle_actions();
    if (expect_fail) {
      if (ctl.run_active() != was_active) {
        fail("start expect_fail: the run started");
        return false;
      }
      frames_left_ = 2;
    } else if (!s.live.active) {
      std::string why = s.status;
      for (const auto& e : s.launcher.errors) why += "; " + e;
      for (const auto& e : s.launcher.start_errors) why += "; " + e;
      fail("start: " + why);
      return false;
    }
  } else if (cmd == "wait_step") {
    return wait(s.live.active && s.live.view.step >= static_cast<int64_t>(arg(1, 1)), arg(2, 120));
  } else if (cmd == "wait_end") {
    return wait(s.live.active && s.live.view.ended() && !ctl.run_active(), arg(1, 120));
  } else if (cmd == "wait_rows") {
    bool settled = s.rows_loaded && s.rows.size() >= static_cast<size_t>(arg(1, 1)) && ctl.pending_tasks() == 0;
    for (const auto& [id, lr] : s.loaded) settled &= lr.loaded_once;
    return wait(settled, arg(2, 60));
  } else if (cmd == "tab") {
    const std::string t = w.size() > 1 ? w[1] : "";
    s.tab = t == "live" ? ui::Tab::Live : t == "runs" ? ui::Tab::Runs : t == "compare" ? ui::Tab::Compare : ui::Tab::Launch;
    s.select_tab = true;
    frames_left_ = 2;  // the tab bar switches on the next frame
  } else if (cmd == "compare") {
    s.compare.runs.clear();
    for (const auto& r : s.rows) {
      s.compare.runs.push_back(r.id);
      s.actions.push_back(ui::act::OpenRun{r.id});
    }
    ctl.handle_actions();
  } else if (cmd == "focus") {
    int64_t id = 0;
    for (const auto& r : s.rows) id = std::max(id, r.id);
    s.runs.focused = id;
    s.runs.selected = {id};
    s.actions.push_back(ui::act::OpenRun{id});
    ctl.handle_actions();
  } else if (cmd == "frames") {
    frames_left_ = static_cast<int>(arg(1, 1));
  } else if (cmd == "stall") {
    stall_ms_ = static_cast<int>(arg(1, 2000));
    stall_report_ = true;
    stall_step_before_ = s.live.view.step;
    stall_started_ = now;
    ++pc_;
    return false;
  } else if (cmd == "command") {
    const std::string c = w.size() > 1 ? w[1] : "";
    const trainer::Command command = c == "pause" ? trainer::Command::Pause
                                     : c == "resume" ? trainer::Command::Resume
                                     : c == "save" ? trainer::Command::SaveNow
                                                   : trainer::Command::Stop;
    s.actions.push_back(ui::act::SendCommand{command});
    ctl.handle_actions();
  } else if (cmd == "screenshot") {
    screenshot_ = w.size() > 1 ? w[1] : "screenshot.png";
    frames_left_ = 1;  // one frame to lay out, the screenshot on the next
    ++pc_;
    return false;
  } else if (cmd == "stats") {
    std::printf("gui stats: %llu frames, live snapshots taken %llu, skipped %llu\n",
                static_cast<unsigned long long>(frames_total_),
                static_cast<unsigned long long>(s.live.snapshots_taken),
                static_cast<unsigned long long>(s.live.snapshots_skipped));
    std::fflush(stdout);
  } else if (cmd == "synthetic") {
    const auto t0 = std::chrono::steady_clock::now();
    make_synthetic_run(s, static_cast<int64_t>(arg(1, 1000000)));
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("gui bench: synthetic run of %zu points in %zu series built in %.1f s\n", s.live.history.points(),
                s.live.history.series().size(), dt);
    std::fflush(stdout);
    frames_left_ = 3;
  } else if (cmd == "bench_frames") {
    bench_left_ = static_cast<int>(arg(1, 300));
    bench_pan_ = w.size() > 2 && w[2] == "pan";
    frame_times_.clear();
    build_times_.clear();
    if (bench_pan_) {
      s.dashboard.x.auto_fit = false;
      s.dashboard.x.x0 = 0;
      s.dashboard.x.x1 = static_cast<double>(s.live.view.total_steps);
    }
    ++pc_;
    return false;
  } else if (cmd == "bench_idle") {
    idle_start_ = now;
    idle_until_ = now + arg(1, 10);
    idle_cpu_start_ = cpu_seconds();
    idle_frames_start_ = frames_total_;
    ++pc_;
    return false;
  } else if (cmd == "resume" || cmd == "tag" || cmd == "rename" || cmd == "note" || cmd == "export_csv") {
    // The focused run's actions, as its buttons in the Runs view emit them.
    const int64_t id = s.runs.focused;
    const std::string rest = w.size() > 1 ? line.substr(line.find(w[1], line.find(cmd) + cmd.size())) : "";
    if (id == 0) {
      fail(cmd + ": no run in focus (use `focus latest` first)");
      return false;
    }
    if (cmd == "resume") {
      // The resume is prepared off the main thread: queue it once, then wait for its outcome.
      // resume STEP expect_refused: it must be refused (nothing starts).
      const bool expect_refused = w.size() > 2 && w[2] == "expect_refused";
      if (!resume_sent_) {
        s.actions.push_back(ui::act::ResumeRun{id, static_cast<int64_t>(arg(1, -1))});
        ctl.handle_actions();
        resume_sent_ = true;
      }
      if (!wait(!ctl.launch_pending(), arg(3, 120))) return false;
      resume_sent_ = false;
      if (expect_refused != s.resume_notice.refused || ctl.run_active() == expect_refused) {
        fail(line + ": " + (s.resume_notice.refused ? "refused: " + s.status : "it started"));
        return false;
      }
      std::printf("gui script: resume %s: %s\n", s.resume_notice.refused ? "refused" : "started", s.status.c_str());
      std::fflush(stdout);
      frames_left_ = 2;
      return false;
    }
    if (cmd == "tag") s.actions.push_back(ui::act::AddTag{id, rest});
    else if (cmd == "rename") s.actions.push_back(ui::act::RenameRun{id, rest});
    else if (cmd == "note") s.actions.push_back(ui::act::SetNote{id, rest});
    else s.actions.push_back(ui::act::ExportCsv{id, rest});
    ctl.handle_actions();
  } else if (cmd == "checkpoint") {
    // checkpoint verify STEP | checkpoint export STEP DIR | checkpoint expect STEP ok|mismatch|missing
    const int64_t id = s.runs.focused;
    const std::string what = w.size() > 1 ? w[1] : "";
    const int64_t step = static_cast<int64_t>(arg(2, -1));
    const auto lr = s.loaded.find(id);
    const storage::CheckpointRecord* rec = nullptr;
    if (lr != s.loaded.end())
      for (const auto& c : lr->second.checkpoints)
        if (c.step == step) rec = &c;
    if (!rec) {
      fail("checkpoint: the focused run has no checkpoint at step " + std::to_string(step));
      return false;
    }
    if (what == "verify") {
      s.actions.push_back(ui::act::VerifyCheckpoint{id, step, rec->path, rec->sha256});
    } else if (what == "export") {
      s.actions.push_back(ui::act::ExportCheckpoint{id, step, rec->path, w.size() > 3 ? w[3] : "export"});
    } else if (what == "expect") {
      const auto it = lr->second.checksum.find(step);
      const ui::ChecksumState st = it == lr->second.checksum.end() ? ui::ChecksumState::Unchecked : it->second;
      const std::string want = w.size() > 3 ? w[3] : "ok";
      const char* got = st == ui::ChecksumState::Ok         ? "ok"
                        : st == ui::ChecksumState::Mismatch ? "mismatch"
                        : st == ui::ChecksumState::Missing  ? "missing"
                                                            : "unchecked";
      if (want != got) {
        fail("checkpoint " + std::to_string(step) + ": checksum " + got + ", expected " + want);
        return false;
      }
    }
    ctl.handle_actions();
  } else if (cmd == "wait_tasks") {
    return wait(ctl.pending_tasks() == 0, arg(1, 30));
  } else if (cmd == "mouse") {
    mouse_set_ = w.size() > 2;
    if (mouse_set_) {
      mouse_x_ = static_cast<float>(arg(1, 0));
      mouse_y_ = static_cast<float>(arg(2, 0));
    }
    frames_left_ = 2;
  } else if (cmd == "smoothing") {
    s.dashboard.smoothing = arg(1, 0.6);
    s.compare.smoothing = arg(1, 0.6);
    frames_left_ = 2;
  } else if (cmd == "close") {
    ctl.request_close();
    frames_left_ = 2;
  } else if (cmd == "key") {
    const std::string k = w.size() > 1 ? w[1] : "";
    const ImGuiKey_ key = k == "enter" ? ImGuiKey_Enter : k == "escape" ? ImGuiKey_Escape : ImGuiKey_Space;
    key_ = ImGui::GetIO().KeyMap[key];
    frames_left_ = 2;  // pressed in the first, released before the second
  } else if (cmd == "wait_saving") {
    // A checkpoint save of the live run is under way: its step_X.tmp directory exists.
    const std::string dir = s.live.active ? s.live.view.run_dir + "/checkpoints" : "";
    const std::string tmp = dir.empty() ? "" : find_unfinished_save(dir);
    if (!tmp.empty()) {
      std::printf("gui script: a save in flight at step %lld: %s\n", static_cast<long long>(s.live.view.step), tmp.c_str());
      std::fflush(stdout);
    }
    return wait(!tmp.empty(), arg(1, 60));
  } else if (cmd == "expect_saving") {
    // The save seen by wait_saving (or another) is still unfinished now.
    const std::string tmp = s.live.active ? find_unfinished_save(s.live.view.run_dir + "/checkpoints") : "";
    std::printf("gui script: save in flight now: %s\n", tmp.empty() ? "none" : tmp.c_str());
    std::fflush(stdout);
  } else if (cmd == "expect_series") {
    // expect_series live|focused KEY [N [TIMEOUT_S]]: the series as plotted has one point per step,
    // in order, and (waiting for reads to arrive) N points.
    const bool live = w.size() > 1 && w[1] == "live";
    const std::string key = w.size() > 2 ? w[2] : "loss";
    const ui::RunHistory* h = live ? &s.live.history : nullptr;
    if (!live) {
      auto it = s.loaded.find(s.runs.focused);
      if (it != s.loaded.end()) h = &it->second.history;
    }
    const ui::MetricSeries* ms = h ? h->find(key) : nullptr;
    const size_t n = ms ? ms->size() : 0;
    double prev = -1;
    for (size_t i = 0; i < n; ++i) {
      const double st = h->timeline().step[ms->t[i]];
      if (st <= prev) {
        fail(line + ": step " + std::to_string(static_cast<int64_t>(st)) + " follows step " +
             std::to_string(static_cast<int64_t>(prev)) + " (a value per step expected)");
        return false;
      }
      prev = st;
    }
    const bool ok = static_cast<double>(n) == arg(3, static_cast<double>(n));
    if (ok) {
      std::printf("gui script: %s %s: %zu points, one per step, last step %lld\n", live ? "live" : "focused",
                  key.c_str(), n, static_cast<long long>(prev));
      std::fflush(stdout);
    }
    if (!wait(ok, arg(4, 30))) {
      if (failed_) std::fprintf(stderr, "gui script: %s has %zu points, last step %lld\n", key.c_str(), n, static_cast<long long>(prev));
      return false;
    }
    return true;
  } else if (cmd == "expect_ranks") {
    // expect_ranks live|focused N: the per-rank view has step time and data wait of ranks 0..N-1.
    const bool live = w.size() > 1 && w[1] == "live";
    const ui::RunHistory* h = live ? &s.live.history : nullptr;
    if (!live) {
      auto it = s.loaded.find(s.runs.focused);
      if (it != s.loaded.end()) h = &it->second.history;
    }
    const size_t want = static_cast<size_t>(arg(2, 2));
    bool ok = h && ui::indexed_keys(*h, "rank", ".step_time_ms").size() == want &&
              ui::indexed_keys(*h, "rank", ".data_wait_ms").size() == want;
    for (size_t r = 0; ok && r < want; ++r) ok = h->find("rank" + std::to_string(r) + ".step_time_ms") != nullptr;
    if (ok) {
      std::printf("gui script: %s per-rank view: %zu ranks, step time", live ? "live" : "focused", want);
      for (size_t r = 0; r < want; ++r)
        std::printf(" %.1f", ui::last_value(*h, "rank" + std::to_string(r) + ".step_time_ms"));
      std::printf(" ms\n");
      std::fflush(stdout);
    }
    return wait(ok, arg(3, 30));
  } else if (cmd == "expect_glyphs") {
    // expect_glyphs [TIMEOUT_S]: every run name in the browser is drawn with the font's own glyphs
    // (none falls back to '?'), waiting for the atlas to take new characters.
    std::string missing;
    for (const ui::RunRow& r : s.rows)
      if (!font_draws(r.name)) missing += (missing.empty() ? "" : ", ") + r.name;
    const bool ok = s.rows_loaded && missing.empty();
    if (ok) {
      std::printf("gui script: glyphs: all %zu run names drawn (fallback font: %s)\n", s.rows.size(),
                  fonts_ != nullptr && !fonts_->fallback_font().empty() ? fonts_->fallback_font().c_str() : "none");
      std::fflush(stdout);
    }
    if (!wait(ok, arg(1, 10))) {
      if (failed_) std::fprintf(stderr, "gui script: names drawn with '?': %s\n", missing.c_str());
      return false;
    }
    return true;
  } else if (cmd == "fake_gpu_block") {
    // The state after a failed multi-GPU run, on a machine without a GPU: the engine's CUDA block
    // (trainer::cuda_blocked_reason) and a GPU in the device list, so runs on "auto" count as GPU runs.
    const std::string why = w.size() > 1 ? line.substr(line.find(w[1], line.find(cmd) + cmd.size())) : "test";
    ctl.set_cuda_blocked_for_test(why);
    s.launcher.devices.push_back("cuda:0 (a GPU faked by the test script)");
    frames_left_ = 2;
  } else if (cmd == "resume_new_process") {
    const int64_t id = s.live.active ? s.live.view.run_id : s.runs.focused;
    s.actions.push_back(ui::act::ResumeInNewProcess{id});
    ctl.handle_actions();
    if (s.children.empty() || s.children.back().run_id != id) {
      fail("resume_new_process: " + s.status);
      return false;
    }
  } else if (cmd == "wait_children") {
    bool running = false;
    for (const auto& c : s.children) running |= c.running;
    if (!running)
      for (const auto& c : s.children) {
        std::printf("gui script: resume process %d of run '%s' %s\n", c.pid, c.run_name.c_str(), c.outcome.c_str());
        std::fflush(stdout);
      }
    return wait(!running, arg(1, 120));
  } else if (cmd == "print") {
    std::printf("%s\n", line.substr(line.find("print") + 6).c_str());
    std::fflush(stdout);
  } else if (cmd == "quit") {
    done_ = true;
    return false;
  } else {
    fail("unknown command: " + line);
    return false;
  }
  ++pc_;
  return frames_left_ == 0;
}

void GuiScript::press_keys() {
  if (key_ < 0) return;
  ImGui::GetIO().KeysDown[key_] = !key_released_;
}

bool GuiScript::mouse_override(float& x, float& y) const {
  if (mouse_set_) {
    x = mouse_x_;
    y = mouse_y_;
    return true;
  }
  if (bench_left_ <= 0) return false;
  // Across the top-left plot of the dashboard, one pixel per frame.
  x = 120.0f + static_cast<float>(frame_times_.size() % 500);
  y = 220.0f;
  return true;
}

std::string GuiScript::take_screenshot_request() {
  if (screenshot_.empty() || frames_left_ > 0) return "";
  std::string s;
  s.swap(screenshot_);
  return s;
}

void GuiScript::after_frame(ui::GuiState& s, double frame_s, double build_s, uint64_t frames_total) {
  frames_total_ = frames_total;
  if (frames_left_ > 0) --frames_left_;
  if (key_ >= 0) {
    // Down for one frame (IsKeyPressed fires there), then up for one, then done.
    if (key_released_) {
      key_ = -1;
      key_released_ = false;
    } else {
      key_released_ = true;
    }
  }
  if (bench_left_ <= 0) return;
  frame_times_.push_back(frame_s);
  build_times_.push_back(build_s);
  if (bench_pan_) {
    // Move the view by 0.2% of its span: every series is reduced again in every frame.
    auto& x = s.dashboard.x;
    const double d = (x.x1 - x.x0) * 0.002;
    x.x0 += d;
    x.x1 += d;
  }
  if (--bench_left_ > 0) return;
  std::vector<double> t = frame_times_;
  std::sort(t.begin(), t.end());
  double sum = 0, build = 0;
  for (double v : t) sum += v;
  for (double v : build_times_) build += v;
  const double mean = sum / static_cast<double>(t.size());
  build /= static_cast<double>(build_times_.size());
  std::printf("gui bench frames (%s, %zu series, %zu points): %zu frames, frame time mean %.2f ms, median %.2f ms, "
              "p95 %.2f ms, max %.2f ms (building %.2f ms, OpenGL the rest) -> %.0f frames/s\n",
              bench_pan_ ? "panning: every series reduced each frame" : "static view, cursor moving",
              s.live.history.series().size(), s.live.history.points(), t.size(), mean * 1e3, t[t.size() / 2] * 1e3,
              t[static_cast<size_t>(static_cast<double>(t.size()) * 0.95)] * 1e3, t.back() * 1e3, build * 1e3, 1.0 / mean);
  std::fflush(stdout);
}

}  // namespace app
