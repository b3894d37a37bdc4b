// Fitting text into a column: a long path keeps its end (the run and the step_XXXXXXXX folder a
// user looks for), not its beginning. Pure functions, tested without a window.
#pragma once

#include <functional>
#include <string>

namespace ui {

// `path` itself when width(path) <= max_width; else "…" and the longest end of it that fits,
// starting at a '/' where one allows it (whole folder names), else at a UTF-8 character boundary;
// "…" alone when nothing more fits. width measures text in the caller's units (ImGui::CalcTextSize).
std::string fit_path_tail(const std::string& path, float max_width, const std::function<float(const std::string&)>& width);

}  // namespace ui
