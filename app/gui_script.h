// The test-script driver of the desktop app: lines of commands, executed between frames, that
// start runs, wait for steps, switch views, stall a frame, take screenshots and measure. Used by the
// GUI end-to-end test under Xvfb and by the benchmark (--gui-bench runs a built-in script).
//
//   start [expect_fail]           press the launcher's Start (the draft from --config/--set); with
//                                 expect_fail the run must not start (its problems show in the form)
//   wait_step N [TIMEOUT_S]       until the live run has logged step >= N
//   wait_end [TIMEOUT_S]          until the live run has ended and its end is recorded
//   wait_rows N [TIMEOUT_S]       until the runs browser lists >= N runs and their reads settled
//   tab launch|live|runs|compare  switch the view
//   compare all                   put every run into Compare (and read their metrics)
//   focus latest                  show the newest run's details in Runs
//   resume STEP                   resume the focused run from its checkpoint of STEP (-1: newest);
//                                 waits until the resume is prepared and has started
//   tag TAG | rename NAME | note TEXT | export_csv PATH
//                                 the focused run's edits and export, as the Runs view's buttons do
//   checkpoint verify STEP | checkpoint export STEP DIR | checkpoint expect STEP ok|mismatch|missing
//                                 the focused run's checkpoint buttons, and the checksum they show
//   wait_tasks [TIMEOUT_S]        until the background edits and exports are done
//   frames N                      draw N frames
//   stall MS                      sleep MS inside the next frame (the frame loop stops; training must not)
//   command pause|resume|save|stop
//   screenshot PATH               PNG of the next frame, and PATH.plots: the plot areas drawn in it
//                                 ("title x0 y0 x1 y1 RRGGBB:POINTS..." in image pixels, one plot a
//                                 line; POINTS: the series' points in view)
//   stats                         print frames drawn and live snapshots taken / skipped
//   synthetic N                   a fake live run with N points in each dashboard series (benchmark)
//   bench_frames N [pan]          draw N frames without vsync, print frame time (pan: move the view
//                                 every frame, so every series is reduced again)
//   bench_idle SECONDS            no input, no new data: print CPU use and frames drawn
//   mouse X Y | mouse off         put the cursor there for the following frames (hover readouts)
//   smoothing W                   the dashboard's and compare's EMA weight (0 = raw only)
//   close                         press the window's close button (asks first while a run trains;
//                                 while the window waits for a run to stop: quit at once)
//   key enter|escape|space        press a key for one frame (the dialogs' default and cancel)
//   wait_saving [TIMEOUT_S]       until the live run has a checkpoint save under way (step_X.tmp)
//   expect_saving                 print whether a save is still under way
//   expect_series live|focused KEY [N]
//                                 the live (or focused run's) series KEY has one point per step,
//                                 steps increasing, and N points
//   expect_ranks live|focused N [TIMEOUT_S]
//                                 the per-rank view has step time and data wait of ranks 0..N-1
//   resume STEP expect_refused    the resume must be refused (its notice says why)
//   expect_glyphs [TIMEOUT_S]     every run name is drawn with real glyphs, none as '?' (the font
//                                 atlas takes the characters of names in other scripts)
//   fake_gpu_block TEXT           act as after a failed multi-GPU run: the GPU is blocked for this
//                                 process with reason TEXT, and a (fake) GPU is listed
//   resume_new_process            resume the live (else the focused) run in a new process
//   wait_children [TIMEOUT_S]     until every resume process has ended; prints how each ended
//   print TEXT                    echo
//   quit
// A wait that times out fails the script (exit code 3) with the line that failed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "app/gui_controller.h"

namespace app {

class GuiFonts;

// Writes the plot areas of the plots drawn in the current ImGui frame of the visible view, in image
// pixels (scale: framebuffer pixels per screen unit), skipping plots cut off by the window bottom.
bool write_plot_areas(const std::string& path, const ui::GuiState& s, float scale, int image_h);

class GuiScript {
 public:
  // Reads the script; `text` wins over `path` when both are given.
  GuiScript(const std::string& path, const std::string& text);
  bool active() const { return !done_; }
  bool failed() const { return failed_; }
  const std::string& error() const { return error_; }

  // Every turn of the frame loop, drawn or not: runs commands until one has to wait. Main thread.
  void tick(GuiController& ctl, double now);
  // Inside a drawn frame (after NewFrame): performs a pending `stall` (sleeps).
  void in_frame();
  // After the frame is rendered: the screenshot asked for, if this is its frame ("" when none).
  std::string take_screenshot_request();
  // Called once per drawn frame with its duration and the part spent building it (ImGui, before
  // OpenGL), in seconds, for bench_frames.
  void after_frame(ui::GuiState& s, double frame_s, double build_s, uint64_t frames_total);
  // Before NewFrame: holds down the key a `key` command pressed (one frame down, one up).
  void press_keys();
  // A mouse position to use instead of the real one (bench_frames sweeps the cursor over a plot so
  // the hover readout is part of the measured frame); false when the real one stands.
  bool mouse_override(float& x, float& y) const;
  // Frames should be drawn without vsync and without waiting (benchmarks).
  bool wants_unthrottled() const { return bench_left_ > 0; }
  // A frame must be drawn even without changes (frames N, screenshots, stalls, benchmarks).
  bool wants_frame() const;
  // While measuring idle, the loop must behave as in normal use (no forced frames, no polling).
  bool measuring_idle() const { return idle_until_ > 0; }
  double idle_until() const { return idle_until_; }
  // The app's fonts, for expect_glyphs to name the fallback in use (may stay null).
  void set_fonts(const GuiFonts* fonts) { fonts_ = fonts; }

 private:
  bool step_command(GuiController& ctl, double now);
  void fail(const std::string& why);

  std::vector<std::string> lines_;
  size_t pc_ = 0;
  bool done_ = false, failed_ = false;
  std::string error_;
  double wait_deadline_ = -1;   // the current wait's timeout (glfwGetTime seconds)
  int frames_left_ = 0;
  std::string screenshot_;
  int stall_ms_ = 0;
  bool mouse_set_ = false;
  float mouse_x_ = 0, mouse_y_ = 0;
  int key_ = -1;                // io.KeysDown index pressed by `key`
  bool key_released_ = false;
  bool resume_sent_ = false;    // `resume` queued its action and waits for the outcome
  bool stall_report_ = false;   // print how far training went while the frame was stalled
  int64_t stall_step_before_ = 0;
  double stall_started_ = 0;
  // bench_frames
  int bench_left_ = 0;
  bool bench_pan_ = false;
  std::vector<double> frame_times_, build_times_;
  // bench_idle
  double idle_until_ = 0, idle_start_ = 0, idle_cpu_start_ = 0;
  uint64_t idle_frames_start_ = 0, frames_total_ = 0;
  const GuiFonts* fonts_ = nullptr;
};

}  // namespace app
