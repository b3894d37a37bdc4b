// The window and the frame loop. The loop draws only when something changed: input (our GLFW
// callbacks count events; ImGui's backend chains to them), a new live snapshot, a background
// result, or the live run's clock (twice a second); otherwise it sleeps in glfwWaitEventsTimeout,
// woken early by glfwPostEmptyEvent from the worker threads. After input it draws a few more
// frames so hover and click states settle. Vsync stays on.
#include "app/gui_app.h"

#include <GLFW/glfw3.h>
#include <imgui.h>
#include <backends/imgui_impl_glfw.h>
#include <backends/imgui_impl_opengl3.h>
#include <stb_image_write.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "app/gui_fonts.h"
#include "app/gui_script.h"
#include "app/signals.h"
#include "storage/file_util.h"
#include "ui/gui/panels.h"

namespace app {

namespace {

constexpr int SETTLE_FRAMES = 3;          // frames drawn after an input event
constexpr double IDLE_WAIT_S = 2.0;       // the longest sleep without events
constexpr double CLOCK_REDRAW_S = 0.5;    // a training run's elapsed/ETA text redraws this often
constexpr double CLOSING_REDRAW_S = 0.25; // the closing dialog's clock while a run stops

// The built-in benchmark: a 1M-point live run in the dashboard; frame time with the cursor moving
// over a plot (cached reduction) and while panning (every series reduced again each frame); then
// the CPU use of the idle app.
const char* BENCH_SCRIPT = R"(
synthetic 1000000
frames 5
bench_frames 240
bench_frames 240 pan
tab runs
frames 3
bench_idle 15
tab live
frames 3
bench_idle 15
quit
)";

struct WindowEvents {
  uint64_t input = 0;       // input events seen (any kind)
  bool close_clicked = false;
  bool rescale = false;     // the content scale changed (moved to another monitor)
};

WindowEvents* events_of(GLFWwindow* w) { return static_cast<WindowEvents*>(glfwGetWindowUserPointer(w)); }

// Installed before ImGui's backend, which calls them from its own callbacks.
void install_callbacks(GLFWwindow* w) {
  glfwSetCursorPosCallback(w, [](GLFWwindow* win, double, double) { ++events_of(win)->input; });
  glfwSetMouseButtonCallback(w, [](GLFWwindow* win, int, int, int) { ++events_of(win)->input; });
  glfwSetScrollCallback(w, [](GLFWwindow* win, double, double) { ++events_of(win)->input; });
  glfwSetKeyCallback(w, [](GLFWwindow* win, int, int, int, int) { ++events_of(win)->input; });
  glfwSetCharCallback(w, [](GLFWwindow* win, unsigned int) { ++events_of(win)->input; });
  glfwSetWindowFocusCallback(w, [](GLFWwindow* win, int) { ++events_of(win)->input; });
  glfwSetCursorEnterCallback(w, [](GLFWwindow* win, int) { ++events_of(win)->input; });
  glfwSetFramebufferSizeCallback(w, [](GLFWwindow* win, int, int) { ++events_of(win)->input; });
  glfwSetWindowRefreshCallback(w, [](GLFWwindow* win) { ++events_of(win)->input; });
  glfwSetWindowContentScaleCallback(w, [](GLFWwindow* win, float, float) {
    events_of(win)->rescale = true;
    ++events_of(win)->input;
  });
  // Closing is decided by the app (a live run asks first), not by GLFW.
  glfwSetWindowCloseCallback(w, [](GLFWwindow* win) {
    glfwSetWindowShouldClose(win, GLFW_FALSE);
    events_of(win)->close_clicked = true;
    ++events_of(win)->input;
  });
}

float content_scale(GLFWwindow* w) {
  float xs = 1, ys = 1;
  glfwGetWindowContentScale(w, &xs, &ys);
  const float s = std::max(xs, ys);
  return s > 0.5f && s < 8.0f ? s : 1.0f;
}

// The style's sizes at the monitor's scale (the fonts are GuiFonts').
void setup_style(float scale) {
  ImGuiStyle style;
  ImGui::StyleColorsDark(&style);
  style.WindowPadding = ImVec2(10, 8);
  style.FramePadding = ImVec2(6, 3);
  style.ItemSpacing = ImVec2(8, 5);
  style.FrameRounding = 3;
  style.GrabRounding = 3;
  style.TabRounding = 3;
  style.ScrollbarRounding = 3;
  style.Colors[ImGuiCol_WindowBg] = ImVec4(0.09f, 0.095f, 0.11f, 1.0f);
  style.Colors[ImGuiCol_FrameBg] = ImVec4(0.14f, 0.15f, 0.18f, 1.0f);
  style.Colors[ImGuiCol_PlotHistogram] = ImVec4(0.26f, 0.59f, 0.98f, 0.85f);
  style.ScaleAllSizes(scale);
  ImGui::GetStyle() = style;
}

bool save_png(const std::string& path, int w, int h) {
  std::vector<unsigned char> px(static_cast<size_t>(w) * h * 4);
  glPixelStorei(GL_PACK_ALIGNMENT, 1);
  glReadBuffer(GL_BACK);
  glReadPixels(0, 0, w, h, GL_RGBA, GL_UNSIGNED_BYTE, px.data());
  // OpenGL's rows run bottom-up; PNG's top-down. Alpha is forced opaque (the back buffer's alpha
  // is whatever blending left).
  std::vector<unsigned char> flipped(px.size());
  for (int y = 0; y < h; ++y)
    std::copy_n(&px[static_cast<size_t>(h - 1 - y) * w * 4], static_cast<size_t>(w) * 4, &flipped[static_cast<size_t>(y) * w * 4]);
  for (size_t i = 3; i < flipped.size(); i += 4) flipped[i] = 255;
  return stbi_write_png(path.c_str(), w, h, 4, flipped.data(), w * 4) != 0;
}

}  // namespace

bool display_available() {
  const char* x = std::getenv("DISPLAY");
  const char* wl = std::getenv("WAYLAND_DISPLAY");
  return (x && *x) || (wl && *wl);
}

std::string find_assets_dir() {
  auto has_font = [](const std::string& dir) { return storage::files::exists(dir + "/fonts/DejaVuSans.ttf"); };
  if (const char* env = std::getenv("DELTADECK_ASSETS"); env && *env && has_font(env)) return env;
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n > 0) {
    buf[n] = 0;
    std::string dir = storage::files::parent_dir(buf);
    // build/app/deltadeck -> <checkout>/assets; an installed bin/deltadeck -> share/deltadeck/assets.
    for (const char* rel : {"/../../assets", "/../assets", "/../share/deltadeck/assets"})
      if (has_font(dir + rel)) return dir + rel;
  }
#ifdef DD_SOURCE_DIR
  if (has_font(std::string(DD_SOURCE_DIR) + "/assets")) return std::string(DD_SOURCE_DIR) + "/assets";
#endif
  return "";
}

int run_gui(const GuiArgs& args) {
  glfwSetErrorCallback([](int code, const char* what) { std::fprintf(stderr, "deltadeck: GLFW error %d: %s\n", code, what); });
  if (!glfwInit()) {
    std::fprintf(stderr, "deltadeck: cannot open a window (no display?). Run headless with: deltadeck train --no-gui\n");
    return 1;
  }
  glfwWindowHint(GLFW_CONTEXT_VERSION_MAJOR, 3);
  glfwWindowHint(GLFW_CONTEXT_VERSION_MINOR, 3);
  glfwWindowHint(GLFW_OPENGL_PROFILE, GLFW_OPENGL_CORE_PROFILE);
  glfwWindowHint(GLFW_OPENGL_FORWARD_COMPAT, GL_TRUE);
  glfwWindowHint(GLFW_SCALE_TO_MONITOR, GLFW_TRUE);
  GLFWwindow* window = glfwCreateWindow(args.width, args.height, "deltadeck", nullptr, nullptr);
  if (!window) {
    std::fprintf(stderr, "deltadeck: cannot create an OpenGL 3.3 window. Run headless with: deltadeck train --no-gui\n");
    glfwTerminate();
    return 1;
  }
  glfwMakeContextCurrent(window);
  glfwSwapInterval(1);
  WindowEvents ev;
  glfwSetWindowUserPointer(window, &ev);
  install_callbacks(window);

  IMGUI_CHECKVERSION();
  ImGui::CreateContext();
  ImGuiIO& io = ImGui::GetIO();
  io.IniFilename = nullptr;  // the layout is fixed; nothing to remember between sessions
  io.ConfigInputTextCursorBlink = false;  // a blinking caret would need redraws while idle
  GuiOptions opts = args.options;
  if (opts.assets_dir.empty()) opts.assets_dir = find_assets_dir();
  GuiFonts fonts(opts.assets_dir);
  fonts.build(content_scale(window));
  setup_style(content_scale(window));
  ImGui_ImplGlfw_InitForOpenGL(window, true);
  ImGui_ImplOpenGL3_Init("#version 150");

  int exit_code = 0;
  {
    GuiController ctl(opts, [] { glfwPostEmptyEvent(); });
    ui::GuiState& s = ctl.state();
    // --screenshot alone: wait for the database's first read, draw a few frames, save, quit.
    const std::string builtin = args.bench ? BENCH_SCRIPT
                                : (args.test_script.empty() && !args.screenshot.empty()) ? "wait_rows 0 30\nframes 5\n"
                                                                                         : "";
    GuiScript script(args.test_script, builtin);
    script.set_fonts(&fonts);
    const bool scripted = !args.test_script.empty() || !builtin.empty();
    double cpu_done = 0;  // when the last frame's ImGui work ended (before OpenGL), for the benchmark
    // One frame: backends, panels, render into the back buffer (not swapped).
    auto draw_frame = [&](GuiScript* sc, int& fw, int& fh) {
      ImGui_ImplOpenGL3_NewFrame();
      ImGui_ImplGlfw_NewFrame();
      float mx = 0, my = 0;
      if (sc && sc->mouse_override(mx, my)) io.MousePos = ImVec2(mx, my);
      if (sc) sc->press_keys();
      ImGui::NewFrame();
      if (sc) sc->in_frame();
      ui::draw_main(s);
      ImGui::Render();
      cpu_done = glfwGetTime();
      glfwGetFramebufferSize(window, &fw, &fh);
      glViewport(0, 0, fw, fh);
      glClearColor(0.09f, 0.095f, 0.11f, 1.0f);
      glClear(GL_COLOR_BUFFER_BIT);
      ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());
    };
    if (scripted && script.failed()) exit_code = 3;
    // SIGINT/SIGTERM/SIGHUP as in `deltadeck train`: a run training here stops with a checkpoint, then the
    // window closes; a second SIGINT exits at once (signals.h).
    install_stop_signals();
    int signals_seen = 0;
    uint64_t seen_input = ~0ull, frames = 0;
    int settle = SETTLE_FRAMES;
    double last_draw = 0;
    bool unthrottled = false;
    // While the window waits for a run to stop it redraws more often: the closing dialog counts the
    // seconds. The figures of that wait are printed for tests (frames drawn, the longest gap).
    double close_started = -1, close_gap = 0;
    uint64_t close_frames = 0;
    int64_t close_from_step = 0;
    while (exit_code == 0) {
      const double redraw_s = s.close.closing ? CLOSING_REDRAW_S : CLOCK_REDRAW_S;
      // Sleep until something happens, at most until the next poll or clock tick.
      const double now0 = glfwGetTime();
      const bool script_busy = scripted && script.active() && !script.measuring_idle();
      if (settle > 0 || script.wants_frame()) {
        glfwPollEvents();
      } else {
        double wait = std::min(IDLE_WAIT_S, ctl.next_poll_in(now0));
        if (ctl.run_active() || s.close.closing) wait = std::min(wait, std::max(0.0, last_draw + redraw_s - now0));
        if (script_busy) wait = std::min(wait, 0.02);
        if (script.measuring_idle()) wait = std::min(wait, std::max(0.0, script.idle_until() - now0));
        glfwWaitEventsTimeout(std::max(wait, 0.001));
      }
      const double now = glfwGetTime();
      if (ev.input != seen_input) {
        seen_input = ev.input;
        settle = SETTLE_FRAMES;
      }
      if (stop_signals_received() > signals_seen) {
        signals_seen = stop_signals_received();
        ctl.stop_and_close();
      }
      if (ev.close_clicked) {
        ev.close_clicked = false;
        ctl.request_close();
      }
      if (ctl.update(now)) settle = std::max(settle, 1);
      if ((ctl.run_active() || s.close.closing) && now - last_draw >= redraw_s) settle = std::max(settle, 1);
      if (scripted) {
        script.tick(ctl, now);
        if (script.failed()) exit_code = 3;
        // The script is done: close as the window's close button would after confirming (a run
        // still training stops with a checkpoint first; the window keeps drawing meanwhile).
        if (!script.active() && !script.wants_frame() && !s.quit) ctl.stop_and_close();
      }
      if (s.quit && close_started < 0 && s.close.closing) {
        close_started = now;
        close_frames = 0;
        close_gap = 0;
        close_from_step = s.live.view.step;
      }
      if (ctl.quit_now()) break;
      if (ctl.ready_to_quit()) break;
      // A new scale, or text in characters the atlas lacks (the state as ctl.update left it): the
      // atlas again, before the frame that shows it. Text is looked at from the second frame on: the
      // backend makes its own font texture in the first NewFrame.
      const bool rescale = ev.rescale;
      ev.rescale = false;
      if (rescale || (frames > 0 && fonts.wants_rebuild(s))) {
        const float scale = content_scale(window);
        auto build_and_upload = [&] {
          fonts.build(scale);
          ImGui_ImplOpenGL3_DestroyFontsTexture();
          ImGui_ImplOpenGL3_CreateFontsTexture();
        };
        build_and_upload();
        // A fallback font for what DejaVu lacks, then one more for what that lacks (each found once).
        for (int extra = 0; extra < 3 && fonts.check_coverage(); ++extra) build_and_upload();
        if (rescale) setup_style(scale);
        if (std::string notice = fonts.take_missing_font_notice(); !notice.empty()) s.set_status(notice);
        settle = std::max(settle, 1);
      }
      if (glfwGetWindowAttrib(window, GLFW_ICONIFIED) && !script.wants_frame()) continue;
      if (settle <= 0 && !script.wants_frame()) continue;

      if (script.wants_unthrottled() != unthrottled) {
        unthrottled = script.wants_unthrottled();
        glfwSwapInterval(unthrottled ? 0 : 1);
      }
      const double t0 = glfwGetTime();
      int fw = 0, fh = 0;
      draw_frame(&script, fw, fh);
      if (unthrottled) glFinish();  // the benchmark counts the rasterisation too
      const double frame_s = glfwGetTime() - t0;
      const std::string shot = script.take_screenshot_request();
      if (!shot.empty()) {
        const float scale = io.DisplayFramebufferScale.x;
        if (save_png(shot, fw, fh) && write_plot_areas(shot + ".plots", s, scale, fh))
          std::printf("screenshot %s %dx%d\n", shot.c_str(), fw, fh);
        else
          std::fprintf(stderr, "deltadeck: cannot write %s\n", shot.c_str());
        std::fflush(stdout);
      }
      glfwSwapBuffers(window);
      ++frames;
      if (close_started >= 0) {
        ++close_frames;
        close_gap = std::max(close_gap, glfwGetTime() - std::max(last_draw, close_started));
      }
      last_draw = glfwGetTime();
      --settle;
      script.after_frame(s, frame_s, cpu_done - t0, frames);
      ctl.handle_actions();
    }
    // --screenshot: the final state, after the script.
    if (!args.screenshot.empty() && exit_code == 0 && !ctl.quit_now()) {
      for (int i = 0; i < 3; ++i) {
        glfwPollEvents();
        ctl.update(glfwGetTime());
        int fw = 0, fh = 0;
        draw_frame(nullptr, fw, fh);
        if (i == 2) {
          if (save_png(args.screenshot, fw, fh)) std::printf("screenshot %s %dx%d\n", args.screenshot.c_str(), fw, fh);
          else exit_code = 1;
        }
        glfwSwapBuffers(window);
      }
    }
    if (close_started >= 0 && scripted) {
      const double t = glfwGetTime();
      std::printf("gui close: waited %.2f s after the close (run step %lld -> %lld, %s); %llu frames drawn "
                  "meanwhile, longest gap between frames %.2f s%s\n",
                  t - close_started, static_cast<long long>(close_from_step), static_cast<long long>(s.live.view.step),
                  s.live.active ? s.live.view.status.c_str() : "no run", static_cast<unsigned long long>(close_frames),
                  std::max(close_gap, t - std::max(last_draw, close_started)), ctl.quit_now() ? "; quit at once" : "");
      std::fflush(stdout);
    }
    if (ctl.quit_now()) {
      // Left at once while the run was still stopping: the run host must not be destroyed (its
      // destructor waits for the run), and nothing may run static destructors under the engine's
      // threads. As with a second stop signal (signals.cpp), the process ends here; what the run
      // committed (checkpoints, database transactions) is intact, and it shows as interrupted.
      std::fprintf(stderr, "deltadeck: closed before run '%s' had stopped; its last committed checkpoint is kept\n",
                   s.live.view.run_name.c_str());
      ImGui_ImplOpenGL3_Shutdown();
      ImGui_ImplGlfw_Shutdown();
      ImGui::DestroyContext();
      glfwDestroyWindow(window);
      glfwTerminate();
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(exit_code);
    }
    // Only an ended run (or none) is left here: ~GuiController does not wait on a training run.
  }
  ImGui_ImplOpenGL3_Shutdown();
  ImGui_ImplGlfw_Shutdown();
  ImGui::DestroyContext();
  glfwDestroyWindow(window);
  glfwTerminate();
  return exit_code;
}

}  // namespace app
