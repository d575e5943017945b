// SVG line plots: axis ranges, ticks, one polyline per series, a legend.
#include "svg_plot.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>

#include "redco/core/error.hpp"

namespace redco::io {
namespace {

std::string escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

struct Range {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  void widen() {  // a single value still gets an axis
    if (hi - lo < 1e-12 * std::max(1.0, std::abs(hi))) lo -= 0.5, hi += 0.5;
  }
};

void check(const std::vector<PlotSeries>& series, const PlotOptions& o) {
  REDCO_CHECK(!series.empty(), "line plot '{}': no series to draw", o.title);
  REDCO_CHECK(o.width >= 200 && o.height >= 200,
              "line plot '{}': width and height must be >= 200 pixels, got {} x {}", o.title,
              o.width, o.height);
  for (const PlotSeries& s : series) {
    REDCO_CHECK(!s.x.empty() && s.x.size() == s.y.size(),
                "line plot '{}': series '{}' has {} x and {} y values; give the same number, "
                "at least 1",
                o.title, s.name, s.x.size(), s.y.size());
    for (size_t i = 0; i < s.x.size(); ++i)
      REDCO_CHECK(std::isfinite(s.x[i]) && std::isfinite(s.y[i]),
                  "line plot '{}': series '{}' point {} is ({}, {}), not finite", o.title, s.name,
                  i, s.x[i], s.y[i]);
  }
}

}  // namespace

std::string line_plot_svg(const std::vector<PlotSeries>& series, const PlotOptions& o) {
  check(series, o);
  static constexpr const char* palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd"};
  Range xr, yr;
  for (const PlotSeries& s : series) {
    for (const double v : s.x) xr.lo = std::min(xr.lo, v), xr.hi = std::max(xr.hi, v);
    for (const double v : s.y) yr.lo = std::min(yr.lo, v), yr.hi = std::max(yr.hi, v);
  }
  xr.widen(), yr.widen();
  const double w = o.width, h = o.height, x0 = kPlotLeft, x1 = w - kPlotRight, y0 = kPlotTop,
               y1 = h - kPlotBottom;
  auto px = [&](double x) { return x0 + (x - xr.lo) / (xr.hi - xr.lo) * (x1 - x0); };
  auto py = [&](double y) { return y1 - (y - yr.lo) / (yr.hi - yr.lo) * (y1 - y0); };
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"{0}\" height=\"{1}\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{3}</text>\n"
      "<rect x=\"{4}\" y=\"{5}\" width=\"{6}\" height=\"{7}\" fill=\"none\" stroke=\"black\"/>\n",
      o.width, o.height, w / 2, escape(o.title), x0, y0, x1 - x0, y1 - y0);
  for (int i = 0; i <= 4; ++i) {  // five ticks per axis, with grid lines
    const double xv = xr.lo + (xr.hi - xr.lo) * i / 4, yv = yr.lo + (yr.hi - yr.lo) * i / 4;
    out += fmt::format(
        "<line x1=\"{0:.2f}\" y1=\"{1}\" x2=\"{0:.2f}\" y2=\"{2}\" stroke=\"#ddd\"/>\n"
        "<text x=\"{0:.2f}\" y=\"{3}\" text-anchor=\"middle\">{4:.4g}</text>\n"
        "<line x1=\"{5}\" y1=\"{6:.2f}\" x2=\"{7}\" y2=\"{6:.2f}\" stroke=\"#ddd\"/>\n"
        "<text x=\"{8}\" y=\"{9:.2f}\" text-anchor=\"end\">{10:.4g}</text>\n",
        px(xv), y0, y1, y1 + 16, xv, x0, py(yv), x1, x0 - 6, py(yv) + 4, yv);
  }
  out += fmt::format(
      "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n"
      "<text x=\"16\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {})\">{}</text>\n",
      (x0 + x1) / 2, h - 12, escape(o.x_label), (y0 + y1) / 2, (y0 + y1) / 2, escape(o.y_label));
  for (size_t k = 0; k < series.size(); ++k) {
    const PlotSeries& s = series[k];
    const char* colour = palette[k % std::size(palette)];
    out +=
        fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"", colour);
    for (size_t i = 0; i < s.x.size(); ++i)
      out += fmt::format("{}{:.2f},{:.2f}", i ? " " : "", px(s.x[i]), py(s.y[i]));
    out += fmt::format("\"/>\n<text x=\"{}\" y=\"{}\" fill=\"{}\">{}</text>\n", x0 + 8,
                       y0 + 16 + 16 * double(k), colour, escape(s.name));
  }
  return out + "</svg>\n";
}

void write_line_plot(const std::filesystem::path& path, const std::vector<PlotSeries>& series,
                     const PlotOptions& options) {
  const std::string svg = line_plot_svg(series, options);
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    REDCO_CHECK(f.good(), "line plot: cannot write {} (does its folder exist and is it writable?)",
                tmp.string());
    f << svg;
    f.close();
    REDCO_CHECK(f.good(), "line plot: writing {} failed (disk full?)", tmp.string());
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  REDCO_CHECK(!ec, "line plot: cannot rename {} to {}: {}", tmp.string(), path.string(),
              ec.message());
}

}  // namespace redco::io
