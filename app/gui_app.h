// The desktop app's window: GLFW + OpenGL 3.3 + Dear ImGui's GLFW/OpenGL3 backends, the frame
// loop, fonts scaled by the monitor's content scale, screenshots, and the test-script driver.
// The frame loop sleeps in glfwWaitEventsTimeout while nothing changes and draws again on input,
// on a new snapshot of the live run or on a background read's result.
// No torch in this header; the caller (app/main.cpp) decides the exit code from the return value.
#pragma once

#include <string>

#include "app/gui_controller.h"

namespace app {

struct GuiArgs {
  GuiOptions options;
  std::string test_script;   // --gui-test-script: drive the app from a script (gui_script.h)
  std::string screenshot;    // --screenshot: save a PNG of the last frame and quit (after the script)
  bool bench = false;        // --gui-bench: frame time with 1M-point series, idle CPU; prints figures
  int width = 1440, height = 900;
};

// True when a window can be opened here (an X11 or Wayland display is named in the environment).
bool display_available();
// Where the shipped assets (fonts, configs) are: $DELTADECK_ASSETS, next to the build tree or
// the source tree this binary was built from; empty when none is found.
std::string find_assets_dir();

// Runs the app until the window closes (or the script ends). Returns the exit code: 0, 1 when the
// window could not open, 3 when a test script failed. Main thread.
int run_gui(const GuiArgs& args);

}  // namespace app
