#include "ui/gui/text_fit.h"

namespace ui {

std::string fit_path_tail(const std::string& path, float max_width, const std::function<float(const std::string&)>& width) {
  if (width(path) <= max_width) return path;
  static const std::string kEllipsis = "\xE2\x80\xA6";  // U+2026
  // Whole folder names first: the cut at the leftmost '/' whose tail fits.
  for (size_t slash = path.find('/', 1); slash != std::string::npos; slash = path.find('/', slash + 1)) {
    const std::string candidate = kEllipsis + path.substr(slash);
    if (width(candidate) <= max_width) return candidate;
  }
  // Not even "…/last" fits: the longest character tail that does.
  for (size_t i = 1; i < path.size(); ++i) {
    if ((static_cast<unsigned char>(path[i]) & 0xC0) == 0x80) continue;  // inside a UTF-8 character
    const std::string candidate = kEllipsis + path.substr(i);
    if (width(candidate) <= max_width) return candidate;
  }
  return kEllipsis;
}

}  // namespace ui
