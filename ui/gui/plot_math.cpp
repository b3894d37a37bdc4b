#include "ui/gui/plot_math.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "ui/log/log_line.h"

namespace ui {

std::vector<double> nice_ticks(double lo, double hi, int target) {
  std::vector<double> out;
  if (!(hi > lo) || !std::isfinite(lo) || !std::isfinite(hi) || target < 1) return out;
  const double raw = (hi - lo) / target;
  const int e = static_cast<int>(std::floor(std::log10(raw)));
  const double mag = std::pow(10.0, e);
  const double norm = raw / mag;
  const double mult = norm < 1.5 ? 1 : norm < 3.5 ? 2 : norm < 7.5 ? 5 : 10;
  const double step = mult * mag;
  // k·mult is an integer; dividing by an exact power of ten gives 0.6, not 3 × 0.2 = 0.6000000000000001.
  const double inv = e < 0 ? std::pow(10.0, -e) : 0;
  for (double k = std::ceil(lo / step);; k += 1) {
    const double v = e < 0 ? (k * mult) / inv : k * mult * mag;
    if (v > hi + step * 1e-9) break;
    out.push_back(v == 0 ? 0.0 : v);
    if (out.size() > 1000) break;
  }
  return out;
}

std::vector<double> log_ticks(double lo, double hi, int target) {
  std::vector<double> out;
  if (!(lo > 0) || !(hi > lo) || !std::isfinite(hi)) return out;
  const int d0 = static_cast<int>(std::floor(std::log10(lo)));
  const int d1 = static_cast<int>(std::ceil(std::log10(hi)));
  const int decades = std::max(1, d1 - d0);
  const bool minor = decades <= target / 3 + 1;
  // Thin whole decades when there are too many (every 2nd, 5th, ...).
  int every = 1;
  while (decades / every > std::max(2, target)) ++every;
  for (int d = d0; d <= d1; ++d) {
    const double base = std::pow(10.0, d);
    if (d % every == 0 && base >= lo && base <= hi) out.push_back(base);
    if (minor)
      for (double m : {2.0, 5.0})
        if (base * m >= lo && base * m <= hi) out.push_back(base * m);
  }
  std::sort(out.begin(), out.end());
  return out;
}

namespace {
double quantile(std::vector<double> v, double q) {
  const size_t k = static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  std::nth_element(v.begin(), v.begin() + static_cast<long>(k), v.end());
  return v[k];
}
}  // namespace

MinMax y_range(const std::vector<double>& mins, const std::vector<double>& maxes, bool ignore_outliers, bool log_y) {
  auto usable = [&](double v) { return std::isfinite(v) && (!log_y || v > 0); };
  std::vector<double> lo, hi;
  lo.reserve(mins.size());
  hi.reserve(maxes.size());
  for (double v : mins) if (usable(v)) lo.push_back(v);
  for (double v : maxes) if (usable(v)) hi.push_back(v);
  MinMax r;
  if (lo.empty() || hi.empty()) return r;
  // Percentiles need enough columns to mean anything; a handful of points shows whole.
  if (ignore_outliers && lo.size() >= 20 && hi.size() >= 20) {
    r.lo = quantile(lo, 0.02);
    r.hi = quantile(hi, 0.98);
    if (r.lo > r.hi) std::swap(r.lo, r.hi);
    return r;
  }
  r.lo = *std::min_element(lo.begin(), lo.end());
  r.hi = *std::max_element(hi.begin(), hi.end());
  return r;
}

MinMax pad_range(MinMax r, double frac, bool log_y) {
  if (r.empty()) return r;
  if (log_y) {
    double a = std::log10(r.lo), b = std::log10(r.hi);
    if (b - a < 1e-9) {
      a -= 0.5;
      b += 0.5;
    }
    const double p = (b - a) * frac;
    return MinMax{std::pow(10.0, a - p), std::pow(10.0, b + p)};
  }
  const double span = r.hi - r.lo;
  if (span <= std::fabs(r.hi) * 1e-12) {
    // A flat series: a band around it, so it is drawn mid-plot rather than on an edge.
    const double p = std::max(std::fabs(r.hi) * 0.1, 1e-9);
    return MinMax{r.lo - p, r.hi + p};
  }
  return MinMax{r.lo - span * frac, r.hi + span * frac};
}

std::string format_value(double v, int digits) {
  if (!std::isfinite(v)) return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

std::string format_compact(double v) {
  if (!std::isfinite(v)) return format_value(v);
  const double a = std::fabs(v);
  char buf[32];
  if (a < 1e3) return format_value(v, 4);
  const char* unit = a < 1e6 ? "k" : a < 1e9 ? "M" : a < 1e12 ? "B" : "T";
  const double div = a < 1e6 ? 1e3 : a < 1e9 ? 1e6 : a < 1e12 ? 1e9 : 1e12;
  std::snprintf(buf, sizeof buf, "%.3g%s", v / div, unit);
  return buf;
}

std::string format_x(double v, XAxis axis) {
  if (axis == XAxis::Wall) return format_duration(v);
  if (std::fabs(v) < 10000) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  return format_compact(v);
}

}  // namespace ui
